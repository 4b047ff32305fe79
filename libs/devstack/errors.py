"""The one error type the local stack raises: its message always says what to do."""

from __future__ import annotations


class StackError(RuntimeError):
    """A problem with the local stack, with a message meant for a person to act on."""
