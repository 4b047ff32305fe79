"""admission-webhook: gates every pod created in a lockgate-managed namespace.

Why it exists: gates can be added to a pod only when it is created, so lockgate must be on the
pod's creation path to hold it for the global, fair scheduler. The webhook resolves the pod's
queue and jobset (pod labels, then its controlling owners, then its namespace), refuses pods
whose queue is missing or cordoned with a message that says what to set, and adds lockgate's
scheduling gate. One process serves several clusters, each on its own path `/mutate/<cluster>`.
"""
