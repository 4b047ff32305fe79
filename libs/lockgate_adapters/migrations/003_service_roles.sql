-- Each service's own Postgres role, granted only the tables it uses (see docs/security.md).
-- Why a function: roles belong to the whole server and are created by an operator (or devstack)
-- with their passwords, but grants belong to each database. Migrating grants to the roles that
-- exist then; whoever creates a role later runs `SELECT lockgate_grant_service_roles()` in each
-- database (devstack does). A later migration that adds a table replaces this function with the
-- table added and calls it.
--   lockgate_queue_store  folds events and serves the admin API: every table (it also migrates,
--                          so in production it usually owns them).
--   lockgate_scheduler    reads jobs, queues and nodes; releases jobs (only the columns a release
--                          sets) and writes release_decisions.
--   lockgate_webhook      reads queues (whether one exists and is cordoned).
CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods TO lockgate_queue_store;
        GRANT SELECT, INSERT ON schema_migrations TO lockgate_queue_store;
        GRANT USAGE, SELECT ON SEQUENCE change_serial TO lockgate_queue_store;
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
REVOKE ALL ON FUNCTION lockgate_grant_service_roles() FROM PUBLIC;
SELECT lockgate_grant_service_roles();
