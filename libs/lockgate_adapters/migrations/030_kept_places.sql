-- Waits that clients survive (lockgate.places; docs/pending-pods.md, "Waits that clients
-- survive"): a pod deleted while queued, never released, leaves its place in line; a
-- replacement doing the same work, stored within the grace period, takes it.
--
-- jobs.queued_since: when the place the job holds in its queue was first taken (NULL: its own
--   created_at). The scheduler orders a queue, and counts the maximum time queued, from it.
-- jobs.kept_place_of: the name of the deleted pod whose place it took ('' none), for its notices.
ALTER TABLE jobs ADD COLUMN queued_since timestamptz;
ALTER TABLE jobs ADD COLUMN kept_place_of text NOT NULL DEFAULT '';

-- One row per place left, written by queue-store's ingest with the job's deletion, read where a
-- new job's row is first written, and deleted once older than the grace period.
-- inherited_by: the uid of the pod that took it (each place is taken once).
CREATE TABLE left_places (
    cluster        text NOT NULL,
    uid            text NOT NULL,
    namespace      text NOT NULL,
    queue          text NOT NULL,
    name           text NOT NULL,
    controller_uid text NOT NULL DEFAULT '',
    requests       jsonb NOT NULL DEFAULT '{}'::jsonb,
    queued_since   timestamptz NOT NULL,
    deleted_at     timestamptz NOT NULL,
    inherited_by   text,
    PRIMARY KEY (cluster, uid)
);
CREATE INDEX left_places_namespace ON left_places (cluster, namespace);
CREATE INDEX left_places_deleted_at ON left_places (deleted_at);

-- 011's function, plus: queue-store reads and writes left_places.
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
