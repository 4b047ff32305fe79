-- A queue's maximum time queued: {"seconds": N, "action": "fail" | "delete"}, validated by
-- lockgate.queues.MaxQueued; NULL (the default) lets pods wait as long as it takes. The
-- fair-scheduler decides when a pod has waited too long and the ungater fails or deletes it
-- (see docs/ARCHITECTURE.md, "Pods that wait"). No new grants: every service role that reads
-- queues already reads every column.
ALTER TABLE queues ADD COLUMN max_queued jsonb;
