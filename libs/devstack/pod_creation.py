"""Creating a pod as a controller does, for tests, benchmarks and demos on the local stack.

Why: lockgate's webhook answers 503 ("retry") while it cannot verify a namespace's labels in
time, as on a saturated apiserver; controllers retry such answers, and whatever stands in for
them here must too, or it measures a failure a real client never sees.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

SERVICE_UNAVAILABLE = 503


async def create_pod_as_a_controller(core: client.CoreV1Api, namespace: str,
                                     body: dict[str, Any], *, retry_seconds: float) -> int:
    """Create the pod, again after each 503 with a backoff (0.25 s doubling to 5 s) for at
    most `retry_seconds`; returns how many times it retried. Any other error is raised."""
    deadline, delay, retries = time.monotonic() + retry_seconds, 0.25, 0
    while True:
        try:
            await core.create_namespaced_pod(namespace, body)
            return retries
        except ApiException as error:
            if error.status != SERVICE_UNAVAILABLE or time.monotonic() > deadline:
                raise
        retries += 1
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)
