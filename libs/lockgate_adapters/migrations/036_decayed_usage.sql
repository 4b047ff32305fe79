-- Usage that decays (issue 36 item 3; docs/scheduling.md, "Usage that decays"): each leaf of
-- the queue tree's decayed usage (share x seconds; inner nodes are sums of their leaves), as the
-- fair-scheduler leader last stored it: periodically and when it steps down. A new leader
-- restores it, decayed by the time since `as_of`; one row per leaf, all rows of one save with
-- the same `as_of` and `half_life_seconds`. Usage kept with another half-life cannot be
-- converted (its past is already weighed), so a leader with a new half-life rebuilds it from the
-- jobs' records instead, as when the rows are lost.
CREATE TABLE IF NOT EXISTS decayed_usage (
    queue             text PRIMARY KEY,
    usage             double precision NOT NULL CHECK (usage >= 0),
    half_life_seconds double precision NOT NULL CHECK (half_life_seconds > 0),
    as_of             timestamptz NOT NULL,
    saved_by          text NOT NULL
);

-- 035's function (issue 35), plus: the scheduler keeps decayed_usage; queue-store may read it.
-- 035's grants on cluster_growth are kept, guarded by whether the table exists, since this
-- migration was written on a branch without 035 (after both are merged the guard always holds).
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
        GRANT SELECT ON controller_backoffs TO lockgate_queue_store;
        GRANT SELECT ON decayed_usage TO lockgate_queue_store;
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
        GRANT SELECT, INSERT, UPDATE, DELETE ON decayed_usage TO lockgate_scheduler;
    END IF;
    -- 035's grants (issue 35, written beside this one): cluster_growth once it exists.
    IF to_regclass('cluster_growth') IS NOT NULL THEN
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
            GRANT SELECT, INSERT, UPDATE, DELETE ON cluster_growth TO lockgate_queue_store;
        END IF;
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
            GRANT SELECT ON cluster_growth TO lockgate_scheduler;
        END IF;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_webhook') THEN
        GRANT SELECT ON queues, schema_migrations TO lockgate_webhook;
    END IF;
END
$$;
SELECT lockgate_grant_service_roles();
