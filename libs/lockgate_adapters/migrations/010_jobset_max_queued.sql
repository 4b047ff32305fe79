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
-- columns. The function as of 009, unchanged, so the lead merges one list.
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial, ephemeral_namespace_transitions_id_seq
            TO lockgate_queue_store;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
        GRANT SELECT ON queues, jobs, cluster_nodes, release_decisions, schema_migrations
            TO lockgate_scheduler;
        GRANT UPDATE (state, decision_id, released_at, state_changed_at, release_attempts,
            serial, unplaceable_at, last_reason) ON jobs TO lockgate_scheduler;
        GRANT INSERT ON release_decisions TO lockgate_scheduler;
        GRANT UPDATE (published_at) ON release_decisions TO lockgate_scheduler;
        GRANT SELECT, INSERT ON evictions TO lockgate_scheduler;
        GRANT UPDATE (published_at) ON evictions TO lockgate_scheduler;
        GRANT USAGE ON SEQUENCE change_serial TO lockgate_scheduler;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_webhook') THEN
        GRANT SELECT ON queues, schema_migrations TO lockgate_webhook;
    END IF;
END
$$;
SELECT lockgate_grant_service_roles();
