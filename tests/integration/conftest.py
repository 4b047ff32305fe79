"""Integration tests run against the real local stack (see docs/local-stack.md).

Every test here needs the stack: it is brought up (or reused) once per session before the first
test, and if it cannot be, each test fails with devstack's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from devstack import StackInfo


@pytest.fixture(scope="session", autouse=True)
def _stack_is_up(stack: StackInfo) -> StackInfo:
    return stack
