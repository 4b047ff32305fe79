-- Pod groups (gangs), priority classes and preemption to fair share (issue 10, items 3-4).
--
-- jobs: a pod's group ("<namespace>/<name>", NULL for none) and its size, whether its
-- lockgate.io/preemptible label says "true", and its priority class (a class the scheduler is
-- configured to treat as preemptible makes the pod preemptible too).
ALTER TABLE jobs
    ADD COLUMN pod_group      text,
    ADD COLUMN pod_group_size integer NOT NULL DEFAULT 0
        CHECK (pod_group_size BETWEEN 0 AND 10000),
    ADD COLUMN preemptible    boolean NOT NULL DEFAULT false,
    ADD COLUMN priority_class text NOT NULL DEFAULT '';

-- queues: how long a group may take to fill up, and what then becomes of its members.
ALTER TABLE queues
    ADD COLUMN group_timeout_seconds double precision
        CHECK (group_timeout_seconds IS NULL OR group_timeout_seconds > 0),
    ADD COLUMN group_timeout_action  text NOT NULL DEFAULT 'delete'
        CHECK (group_timeout_action IN ('delete', 'fail'));

-- Every pod lockgate removes: evicted to give another queue its fair share (preempted), or a
-- member of a group that timed out. Written by the scheduler leader, on its own connection and
-- before the notice that makes the ungater act is published (published_at set after), so a
-- new leader re-publishes what was recorded but not published. One row per pod: a pod is
-- removed once; planning it again (a new leader, the pod not gone yet) finds the row.
CREATE TABLE evictions (
    eviction_id  text PRIMARY KEY,
    cluster      text NOT NULL,
    uid          text NOT NULL,
    namespace    text NOT NULL,
    name         text NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('preempted', 'group_timeout')),
    action       text NOT NULL CHECK (action IN ('delete', 'fail')),
    for_queue    text,            -- preempted: the queue the room was freed for
    for_uid      text,            -- ... and its pod that was waiting
    message      text NOT NULL,   -- the reason, as the Event on the pod says it
    decided_at   timestamptz NOT NULL,
    decided_by   text NOT NULL,
    published_at timestamptz,
    UNIQUE (cluster, uid)
);
CREATE INDEX evictions_unpublished ON evictions (decided_at) WHERE published_at IS NULL;

CREATE OR REPLACE FUNCTION lockgate_grant_service_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_queue_store') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON queues, jobsets, jobs, release_decisions,
            cluster_nodes, clusters, cluster_snapshot_pods, ephemeral_namespaces,
            ephemeral_namespace_transitions, jobset_cancellations TO lockgate_queue_store;
        GRANT SELECT ON evictions TO lockgate_queue_store;
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
        GRANT USAGE ON SEQUENCE change_serial TO lockgate_scheduler;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockgate_webhook') THEN
        GRANT SELECT ON queues, schema_migrations TO lockgate_webhook;
    END IF;
END
$$;
SELECT lockgate_grant_service_roles();
