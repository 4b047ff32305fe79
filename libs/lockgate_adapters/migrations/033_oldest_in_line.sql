-- `lockgate status` shows how long each queue's oldest queued pod has waited. The scheduler
-- leader keeps counts but no per-queue minimum, and a pass over the queued pods per request costs
-- a million rows at fleet scale; this index makes it one probe per queue (job_views.oldest_in_line).
CREATE INDEX IF NOT EXISTS jobs_in_line_since
    ON jobs (queue, (COALESCE(queued_since, created_at)))
    WHERE state = 'queued';
