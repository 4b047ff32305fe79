-- How each pod listed by a cluster's latest snapshot had ended (ClusterSnapshot.ended), NULL for
-- a pod listed unfinished. Why: a pod event observed before that snapshot may be stored after
-- it (another topic); such a late event of a pod that finished while the watcher was down must
-- take the outcome the snapshot saw, not pass for vanished (lockgate.ingest).
ALTER TABLE cluster_snapshot_pods ADD COLUMN state text
    CHECK (state IS NULL OR state IN ('succeeded', 'failed', 'deleted'));
