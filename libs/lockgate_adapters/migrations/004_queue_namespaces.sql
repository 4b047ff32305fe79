-- Which namespaces may use each queue: a JSON list of bindings
-- [{"cluster": "cluster-a" | "*", "names": [...], "selector": {"matchLabels": {...},
--   "matchExpressions": [...]}}], validated by lockgate.queues.NamespaceBinding.
-- Why: a pod's queue label must not let one team run under another's queue.
-- Existing queues get no binding: no namespace may use them until an operator binds them
-- ('lockgate queue update Q --namespace CLUSTER/NAMESPACE'), see docs/admission.md.
ALTER TABLE queues ADD COLUMN namespaces jsonb NOT NULL DEFAULT '[]'::jsonb;
