-- The web UI's waiting pages walk a queue in the scheduler's release order, which counts a pod's
-- time in line from the place it kept (030: COALESCE(queued_since, created_at)), not from its
-- own creation. jobs_queued_order (016) ordered by created_at, so a retried pod that kept its
-- place was shown behind pods the scheduler releases after it.
DROP INDEX IF EXISTS jobs_queued_order;
CREATE INDEX IF NOT EXISTS jobs_queued_in_line
    ON jobs (queue, priority DESC, (COALESCE(queued_since, created_at)), cluster, uid)
    WHERE state = 'queued';
