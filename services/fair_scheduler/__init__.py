"""fair-scheduler: decides which gated pods to release, fairly across queues and clusters.

Why a separate service: fairness needs one global view and one decider. Instances elect a
leader through a Postgres advisory lock; the leader keeps every queue, node and unfinished job
in memory (loaded once, then updated from the change feed), runs a dominant-resource-fairness
round (`lockgate.scheduler`) whenever something changes, records its decisions in Postgres and
only then publishes release commands for the ungater. Standbys wait to take over.
"""
