-- Pods that skipped the gate (lockgate.observing.skipped_the_gate): a pod that carries a queue's
-- label, in a namespace the queue binds, that lockgate never gated (its webhook did not serve
-- the namespace, or failed open). Its job is a job like any other, so it holds its queue's
-- usage while it runs; this marks it, set once with its row, so status, explain and the web UI
-- can say so. The index keeps `lockgate status`'s count per queue one probe per queue.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS skipped_gate boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS jobs_skipped_gate_unfinished
    ON jobs (queue)
    WHERE skipped_gate AND state NOT IN ('succeeded', 'failed', 'deleted', 'cancelled');
