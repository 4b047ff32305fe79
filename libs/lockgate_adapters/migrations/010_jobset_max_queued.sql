-- A job set's own maximum time queued (issue 9, item 5; lockgate.max_queued).
--
-- jobs.max_queued: the pod's job-set rule, {"seconds": N, "action": "fail"|"delete"|null}, read
--   from its annotations lockgate.io/max-queued-time and lockgate.io/on-max-queued (the webhook
--   stamps them from the pod's namespace); NULL: only its queue's rule. The scheduler ends a pod
--   by the stricter of its queue's and this.
-- ephemeral_namespaces.max_queued: the same, as given to `lockgate namespace create
--   --max-queued-time` (NULL: none); queue-store writes it on the namespace as those annotations.
ALTER TABLE jobs ADD COLUMN max_queued jsonb
    CHECK (max_queued IS NULL OR (jsonb_typeof(max_queued -> 'seconds') = 'number'
                                  AND (max_queued -> 'seconds')::double precision > 0));
ALTER TABLE ephemeral_namespaces ADD COLUMN max_queued jsonb
    CHECK (max_queued IS NULL OR (jsonb_typeof(max_queued -> 'seconds') = 'number'
                                  AND (max_queued -> 'seconds')::double precision > 0));

-- No new rights: the services' table-wide SELECT (and queue-store's writes) cover the new
-- columns, so lockgate_grant_service_roles() stays as 009 left it.
