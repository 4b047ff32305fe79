-- Job-set cancellation (`lockgate jobset cancel Q J --reason R`).
--
-- The cancel command travels on lockgate.jobset-commands.v1; queue-store records the first
-- cancel of each job set here (later ones, and redeliveries, change nothing), sets the job set's
-- unfinished jobs to the new terminal state `cancelled` with last_reason "cancelled: <reason>",
-- and starts collecting its ephemeral namespaces (trigger cancelled). jobs.state has no CHECK,
-- so the new state needs no change there; the partial index of unfinished jobs leaves it out.
CREATE TABLE jobset_cancellations (
    queue         text NOT NULL,
    jobset        text NOT NULL,
    command_id    text NOT NULL,
    reason        text NOT NULL,
    requested_by  text NOT NULL,
    requested_at  timestamptz NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT now(),
    jobs_cancelled integer NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, jobset)
);

DROP INDEX IF EXISTS jobs_unfinished;
CREATE INDEX jobs_unfinished ON jobs (cluster, queue, state)
    WHERE state NOT IN ('succeeded', 'failed', 'deleted', 'cancelled');
-- The finished trigger asks, per job set, how many jobs it has and whether any is unfinished.
CREATE INDEX jobs_of_jobset ON jobs (queue, jobset);

CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial, ephemeral_namespace_transitions_id_seq
            TO lockgate_queue_store;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_scheduler') THEN
        GRANT SELECT ON queues, jobs, cluster_nodes, release_decisions, schema_migrations
            TO lockgate_scheduler;
        GRANT UPDATE (state, decision_id, released_at, state_changed_at, release_attempts,
            serial) ON jobs TO lockgate_scheduler;
        GRANT INSERT ON release_decisions TO lockgate_scheduler;
        GRANT UPDATE (published_at) ON release_decisions TO lockgate_scheduler;
        GRANT USAGE ON SEQUENCE change_serial TO lockgate_scheduler;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_webhook') THEN
        GRANT SELECT ON queues, schema_migrations TO lockgate_webhook;
    END IF;
END
$$;
SELECT lockgate_grant_service_roles();
