-- The queue tree (issue 36; lockgate.queue_tree, docs/scheduling.md "Hierarchical fair
-- targets"): each queue names its parent (NULL: a child of the root, as every queue was before)
-- and may have a guarantee (Kubernetes quantities, as resource_limits; '{}': none). A tree
-- node's limit is resource_limits, for a leaf and an inner node alike.
-- Not a foreign key: queues are tombstoned (deleted = true), not removed, and the admin API
-- checks the whole tree under one lock (job_store.QUEUE_TREE_LOCK) before every write.
ALTER TABLE queues ADD COLUMN IF NOT EXISTS parent text;
ALTER TABLE queues ADD COLUMN IF NOT EXISTS guarantee jsonb NOT NULL DEFAULT '{}'::jsonb;
