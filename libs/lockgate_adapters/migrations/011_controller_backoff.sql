-- Back-off per controller for pods lockgate keeps giving up on (lockgate.backoff;
-- docs/scheduling.md, "Released pods that cannot be placed").
--
-- jobs.controller_uid: the uid of the pod's controlling ownerReference ('' for none), from the
--   watcher's PodEvent.controller_uid: what identifies a ReplicaSet, Job, ... across the pods it
--   creates.
ALTER TABLE jobs ADD COLUMN controller_uid text NOT NULL DEFAULT '';

-- One row per controller that backs off, written by the scheduler leader (on its own
-- connection, in the transaction that records the give-up), so a new leader carries on: its
-- queued pods wait until `until`; `attempts` counts consecutive give-ups (the delay doubles).
-- The row goes when a pod of the controller created after `given_up_at` binds, or once it has
-- been over for the scheduler's unplaceable_backoff_forget_seconds.
CREATE TABLE controller_backoffs (
    cluster        text NOT NULL,
    controller_uid text NOT NULL,
    attempts       integer NOT NULL CHECK (attempts >= 1),
    given_up_at    timestamptz NOT NULL,
    until          timestamptz NOT NULL,
    namespace      text NOT NULL,   -- of the pod given up on last, for people reading the table
    pod            text NOT NULL,
    PRIMARY KEY (cluster, controller_uid)
);

-- 009's function, plus: the scheduler reads and writes controller_backoffs; queue-store reads it
-- (`lockgate explain`, `lockgate status` say a pod waits for its controller's back-off).
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
        GRANT SELECT ON controller_backoffs TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial, ephemeral_namespace_transitions_id_seq
            TO lockgate_queue_store;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
        GRANT SELECT ON queues, jobs, cluster_nodes, release_decisions, schema_migrations
            TO lockgate_scheduler;
        GRANT UPDATE (state, decision_id, released_at, state_changed_at, release_attempts,
            serial, unplaceable_at, last_reason) ON jobs TO lockgate_scheduler;
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
