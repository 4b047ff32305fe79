"""Fairness end to end: every lockgate service as a process, pods created through the API.

Three queues with weights 1:1:2 ask for more than both clusters hold. The test checks what a user
would: once full, each queue runs its weighted share (within one job); capacity freed by pods
that complete goes to the most under-served queue; a pod too big for any node waits without
blocking the others; and when the leading scheduler is SIGKILLed mid-run the standby carries on
and no pod is released twice.

Isolation on the shared stack: a database of its own, the real clusters under names of its own
(so other runs' commands and events are not confused with these), its own webhook registration
that only serves namespaces carrying this run's label, consumer groups that start at the current
end of the topics, and free ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import Lockgate, ServicePorts
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    ReleaseOutcome,
    ReleaseOutcomeKind,
)
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate_adapters.kafka import ensure_topics
from lockgate_adapters.kube import api_client
from lockgate_adapters.service import ServiceContext  # noqa: F401 - keeps the import surface honest
from webhook_registration import delete_registration

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]
