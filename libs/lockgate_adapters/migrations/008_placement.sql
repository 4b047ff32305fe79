-- Placement as kube-scheduler sees it (issue 10, items 1-2): what filters a pod's nodes, what a
-- node offers besides room, and what kube-scheduler says of a released pod it cannot place.
--
-- jobs.placement: the pod's tolerations, nodeSelector and required node affinity
--   (lockgate.placement.PodPlacement as JSON); NULL when the pod carries none of them.
-- jobs.unschedulable_since / unschedulable_message: PodScheduled=False, reason Unschedulable,
--   as the watcher last saw it (NULL/'' when not).
-- jobs.controlled: the pod has a controlling owner (a replacement comes if it is deleted).
-- jobs.unplaceable_at: when the scheduler gave up on a released pod kube-scheduler kept
--   reporting Unschedulable; from then on it is not charged while it stays unbound, and
--   jobs.last_reason says why.
-- cluster_nodes.labels / taints: the node's labels and taints (lockgate.placement.Taint list).
ALTER TABLE jobs ADD COLUMN placement jsonb;
ALTER TABLE jobs ADD COLUMN unschedulable_since timestamptz;
ALTER TABLE jobs ADD COLUMN unschedulable_message text NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN controlled boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN unplaceable_at timestamptz;
ALTER TABLE cluster_nodes ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE cluster_nodes ADD COLUMN taints jsonb NOT NULL DEFAULT '[]'::jsonb;

-- The scheduler also writes unplaceable_at and last_reason (the rest as in 005).
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
            serial, unplaceable_at, last_reason) ON jobs TO lockgate_scheduler;
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
