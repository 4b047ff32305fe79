-- Indexes behind the web UI's pages (lockgate_adapters.ui_views), so a page of a queue with
-- 100,000 queued pods is an index range scan, not a sort of the queue.
--
-- jobs_queued_order: a queue's queued pods in release order (priority, then age; ties by key),
--   what the queue page's "waiting pods" pages walk with OFFSET/LIMIT.
-- evictions_decided: evictions newest first.
CREATE INDEX IF NOT EXISTS jobs_queued_order ON jobs (queue, priority DESC, created_at, cluster, uid)
    WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS evictions_decided ON evictions (decided_at DESC, eviction_id);
-- jobs_unfinished_jobsets: a queue's job sets with unfinished pods, walked one job set at a
--   time (job_views.list_jobsets' skip scan), so a page of job sets does not aggregate every
--   pod of the queue first.
CREATE INDEX IF NOT EXISTS jobs_unfinished_jobsets ON jobs (queue, jobset)
    WHERE state NOT IN ('succeeded', 'failed', 'deleted', 'cancelled');
