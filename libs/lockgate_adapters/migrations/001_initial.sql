-- lockgate's durable state. Written by queue-store (jobs from pod events, capacity, queues via
-- the admin API) and by fair-scheduler (release decisions). Every change to a job, queue or
-- node takes the next value of change_serial, so a reader can load once and then fetch only
-- what changed since the last serial it saw (see lockgate_adapters.postgres.next_serial_lock).

CREATE SEQUENCE change_serial;

CREATE TABLE queues (
    name            text PRIMARY KEY,
    priority_factor double precision NOT NULL DEFAULT 1 CHECK (priority_factor > 0),
    cordoned        boolean NOT NULL DEFAULT false,
    resource_limits jsonb NOT NULL DEFAULT '{}'::jsonb,  -- Kubernetes quantities
    deleted         boolean NOT NULL DEFAULT false,      -- tombstone, so readers see deletions
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    serial          bigint NOT NULL DEFAULT nextval('change_serial')
);
CREATE INDEX queues_serial ON queues (serial);

CREATE TABLE jobsets (
    cluster     text NOT NULL,
    queue       text NOT NULL,
    name        text NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, queue, name)
);

CREATE TABLE jobs (
    cluster          text NOT NULL,
    uid              text NOT NULL,
    namespace        text NOT NULL,
    name             text NOT NULL,
    queue            text NOT NULL,
    jobset           text NOT NULL,
    priority         integer NOT NULL DEFAULT 0,
    requests         jsonb NOT NULL DEFAULT '{}'::jsonb,  -- canonical units (cpu millicores)
    state            text NOT NULL,
    node_name        text,
    created_at       timestamptz NOT NULL,       -- the pod's creationTimestamp
    first_seen_at    timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz NOT NULL DEFAULT now(),
    released_at      timestamptz,
    ungated_at       timestamptz,
    running_at       timestamptz,
    finished_at      timestamptz,
    decision_id      text,                        -- the release decision in force, if any
    release_attempts integer NOT NULL DEFAULT 0,
    last_reason      text NOT NULL DEFAULT '',
    serial           bigint NOT NULL DEFAULT nextval('change_serial'),
    PRIMARY KEY (cluster, uid)
);
CREATE INDEX jobs_serial ON jobs (serial);
CREATE INDEX jobs_unfinished ON jobs (cluster, queue, state)
    WHERE state NOT IN ('succeeded', 'failed', 'deleted');

-- One row per decision, written before the release command is published.
CREATE TABLE release_decisions (
    decision_id  text PRIMARY KEY,
    cluster      text NOT NULL,
    uid          text NOT NULL,
    queue        text NOT NULL,
    decided_at   timestamptz NOT NULL,
    decided_by   text NOT NULL,        -- the scheduler instance holding leadership
    published_at timestamptz,
    outcome      text,
    outcome_at   timestamptz
);
CREATE INDEX release_decisions_job ON release_decisions (cluster, uid);
CREATE INDEX release_decisions_unpublished ON release_decisions (decided_at)
    WHERE published_at IS NULL;

CREATE TABLE cluster_nodes (
    cluster         text NOT NULL,
    node            text NOT NULL,
    allocatable     jsonb NOT NULL,
    unmanaged_usage jsonb NOT NULL DEFAULT '{}'::jsonb,
    schedulable     boolean NOT NULL DEFAULT true,
    present         boolean NOT NULL DEFAULT true,    -- false once the node disappears
    observed_at     timestamptz NOT NULL,
    serial          bigint NOT NULL DEFAULT nextval('change_serial'),
    PRIMARY KEY (cluster, node)
);
CREATE INDEX cluster_nodes_serial ON cluster_nodes (serial);

CREATE TABLE clusters (
    name                 text PRIMARY KEY,
    capacity_observed_at timestamptz,
    last_snapshot_id     text,
    last_snapshot_at     timestamptz
);
