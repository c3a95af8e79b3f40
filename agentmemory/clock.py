"""The store's single notion of "now", replaceable so TTL tests need not sleep."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_offset = timedelta(0)


def now() -> datetime:
    """The current time (timezone-aware UTC), shifted by whatever a test clock advanced."""
    return datetime.now(UTC) + _offset


def advance(seconds: float | timedelta) -> None:
    """Move the store's clock forward (used by the ``memory_clock`` test fixture)."""
    global _offset
    _offset += seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)


def reset() -> None:
    global _offset
    _offset = timedelta(0)
