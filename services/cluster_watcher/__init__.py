"""cluster-watcher: tells the rest of lockgate what is happening in each worker cluster.

Why a separate service: lockgate's decisions are only as good as its picture of the clusters.
One process lists and watches the pods and nodes of several clusters and publishes, keyed by pod
uid so each pod's events stay in order, the lifecycle of every pod lockgate manages (queued,
ungated, bound, running, finished, deleted), a snapshot of the managed pods after each (re)list
so pods that vanished unseen are reconciled, and each cluster's capacity: allocatable per node
minus what pods lockgate does not manage use. It writes nothing to the clusters.
"""
