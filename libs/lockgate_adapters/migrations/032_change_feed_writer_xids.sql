-- The change feed without a global lock (issue 19, writers scale out; lockgate.change_feed).
-- Every changed row of jobs, queues and cluster_nodes records its writer's top-level
-- transaction id (writer_xid, pg_current_xact_id() as bigint: an xid8 never exceeds 2^63 in
-- practice, and bigint has btree support and a native asyncpg codec). An INSERT takes it from
-- the default; every UPDATE sets it beside serial. A reader keeps the snapshot of its last read
-- and fetches the rows whose writer it did not see as committed: writer_xid >= its xmax, or one
-- of its in-progress ids. The indexes serve both (a range and a few equality probes).
-- Existing rows take this migration's transaction id: a reader loads everything after
-- upgrading anyway.
-- The serial column stays: readers still order a read's rows by it, and tests compare it.
ALTER TABLE queues ADD COLUMN writer_xid bigint NOT NULL
    DEFAULT (pg_current_xact_id()::text::bigint);
ALTER TABLE jobs ADD COLUMN writer_xid bigint NOT NULL
    DEFAULT (pg_current_xact_id()::text::bigint);
ALTER TABLE cluster_nodes ADD COLUMN writer_xid bigint NOT NULL
    DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX queues_writer_xid ON queues (writer_xid);
CREATE INDEX jobs_writer_xid ON jobs (writer_xid);
CREATE INDEX cluster_nodes_writer_xid ON cluster_nodes (writer_xid);

-- 030's function, plus: the scheduler sets writer_xid on the jobs it changes.
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
        GRANT SELECT ON controller_backoffs TO lockgate_queue_store;
        GRANT SELECT, INSERT, UPDATE, DELETE ON left_places TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial, ephemeral_namespace_transitions_id_seq
            TO lockgate_queue_store;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
        GRANT SELECT ON queues, jobs, cluster_nodes, release_decisions, schema_migrations
            TO lockgate_scheduler;
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
