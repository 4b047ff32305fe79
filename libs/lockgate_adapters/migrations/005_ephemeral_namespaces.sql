-- Ephemeral namespaces: one per (queue, job set, cluster) request, created through the admin API,
-- and their garbage-collection records. Why in Postgres: collection must survive a crash of any
-- service half-way through, and every transition is kept with its time and cause, so an operator
-- can see why a namespace went (or why it has not gone yet).
--
-- States (lockgate.namespaces owns the transitions):
--   active    created; its job may create objects in it
--   expiring  a trigger fired (cancelled | finished | ttl | queue_deleted | requested); waiting to
--             be picked up by the collector
--   deleting  the collector asked the cluster to delete it; deleted only once the cluster says
--             it is gone (finalizers included)
--   deleted   gone from its cluster (terminal)
--   failed    the last attempt failed (failure_reason); retried at next_attempt_at with backoff
--
-- Which kinds a queue's namespaces may create: queues.allowed_kinds, a JSON list of lower-case
-- plural resource names with their API group, e.g. ["pods", "services", "configmaps",
-- "deployments.apps"]. NULL means the default list (lockgate.queues.DEFAULT_ALLOWED_KINDS).
ALTER TABLE queues ADD COLUMN allowed_kinds jsonb;

CREATE TABLE ephemeral_namespaces (
    cluster          text NOT NULL,
    name             text NOT NULL,       -- the Kubernetes namespace name
    queue            text NOT NULL,
    jobset           text NOT NULL,
    service_account  text NOT NULL,       -- the job's coordinator identity in the namespace
    state            text NOT NULL CHECK (state IN ('active', 'expiring', 'deleting', 'deleted',
                                                    'failed')),
    ttl_seconds      integer CHECK (ttl_seconds IS NULL OR ttl_seconds > 0),
    expires_at       timestamptz,          -- created_at + ttl, NULL for no TTL
    created_at       timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz NOT NULL DEFAULT now(),
    trigger          text,                 -- why collection started, NULL while active
    failure_reason   text NOT NULL DEFAULT '',
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,          -- when a failed or pending step is next tried
    deleted_at       timestamptz,
    serial           bigint NOT NULL DEFAULT nextval('change_serial'),
    PRIMARY KEY (cluster, name)
);
CREATE INDEX ephemeral_namespaces_jobset ON ephemeral_namespaces (queue, jobset);
CREATE INDEX ephemeral_namespaces_open ON ephemeral_namespaces (state, next_attempt_at)
    WHERE state <> 'deleted';

CREATE TABLE ephemeral_namespace_transitions (
    id          bigserial PRIMARY KEY,
    cluster     text NOT NULL,
    name        text NOT NULL,
    from_state  text,                      -- NULL for the creation
    to_state    text NOT NULL,
    cause       text NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (cluster, name) REFERENCES ephemeral_namespaces (cluster, name)
);
CREATE INDEX ephemeral_namespace_transitions_of ON ephemeral_namespace_transitions (cluster, name);

CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions TO lockgate_queue_store;
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
