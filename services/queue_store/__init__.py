"""queue-store: the single writer of lockgate's job, capacity and queue tables.

Why it exists: cluster-watcher and the ungater only publish what they observe; someone must turn
that stream into durable, queryable state the fair scheduler can load and follow. queue-store
consumes the pod-event, snapshot, capacity and release-outcome topics, folds each batch (pure,
`lockgate.ingest`) into Postgres in one transaction, and commits Kafka offsets only after that.
It also serves the queue admin API that the `lockgate` CLI talks to, so queues exist before pods.
"""
