-- The pods listed by each cluster's latest snapshot (written by queue-store).
-- Why: a snapshot and the pod events it reconciles travel on different topics, so queue-store
-- may store a pod event observed before a snapshot only after it has applied that snapshot. The
-- listing kept here lets it judge such a late event as the snapshot would have: a pod the
-- snapshot did not list, created before it and not seen since, is gone.
-- clusters.last_snapshot_id / last_snapshot_at say which snapshot these rows belong to.

CREATE TABLE cluster_snapshot_pods (
    cluster text NOT NULL,
    uid     text NOT NULL,
    PRIMARY KEY (cluster, uid)
);
