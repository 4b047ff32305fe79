-- What each cluster's autoscaler may still add (issue 35): the newest ClusterGrowth of topic
-- lockgate.cluster-growth.v1 per cluster, written by queue-store, read by the fair scheduler.
-- body: the whole ClusterGrowth as its JSON (lockgate.events; observed_at included); autoscaled
-- and observed_at beside it for queries and for the newest-wins rule (an older picture than the
-- stored one is ignored).
-- The row follows the change feed (lockgate.change_feed) like cluster_nodes: serial and
-- writer_xid change, and the leader hears of it, only when the picture changed, not when a
-- refresh only moved observed_at (the watcher refreshes every 30 s by default).
CREATE TABLE cluster_growth (
    cluster text PRIMARY KEY,
    observed_at timestamptz NOT NULL,
    autoscaled boolean NOT NULL,
    body jsonb NOT NULL,
    serial bigint NOT NULL DEFAULT nextval('change_serial'),
    writer_xid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint)
);
CREATE INDEX cluster_growth_writer_xid ON cluster_growth (writer_xid);

-- 032's function, plus: queue-store writes cluster_growth, the scheduler reads it.
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations, cluster_growth
            TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
        GRANT SELECT ON controller_backoffs TO lockgate_queue_store;
        GRANT SELECT, INSERT, UPDATE, DELETE ON left_places TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial, ephemeral_namespace_transitions_id_seq
            TO lockgate_queue_store;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
        GRANT SELECT ON queues, jobs, cluster_nodes, release_decisions, schema_migrations,
            cluster_growth TO lockgate_scheduler;
        GRANT UPDATE (state, decision_id, released_at, state_changed_at, release_attempts,
            serial, writer_xid, unplaceable_at, last_reason) ON jobs TO lockgate_scheduler;
        GRANT INSERT ON release_decisions TO lockgate_scheduler;
        GRANT UPDATE (published_at) ON release_decisions TO lockgate_scheduler;
        GRANT SELECT, INSERT ON evictions TO lockgate_scheduler;
        GRANT UPDATE (published_at) ON evictions TO lockgate_scheduler;
        GRANT SELECT, INSERT, UPDATE, DELETE ON controller_backoffs TO lockgate_scheduler;
        GRANT USAGE ON SEQUENCE change_serial TO lockgate_scheduler;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_webhook') THEN
        GRANT SELECT ON queues, schema_migrations TO lockgate_webhook;
    END IF;
END
$$;
SELECT lockgate_grant_service_roles();
