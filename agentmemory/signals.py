"""Django signals for application hooks -- an audit log, a webhook, a search index of your own.

Each is sent once the change it tells of is committed, never for one rolled back: at once when
the store's call commits its own transaction, at the caller's COMMIT when the call ran inside
the caller's ``transaction.atomic`` (and not at all if that rolls back). A retried call that
changed nothing (an idempotency key repeated) sends nothing. The sender is
:class:`~agentmemory.MemoryStore`; every signal has ``using`` (the database alias). A receiver
that raises does not fail the call that already committed: its exception is logged
(``agentmemory.signals``) and the other receivers still run.

Sent for every writer -- your code, the admin, the framework adapters, the maintenance
commands -- since they all write through the store.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: A new version holding a value: ``record`` (:class:`~agentmemory.MemoryRecord`), from
#: ``remember``, ``update``, ``remember_many`` (one per key) or ``revert``.
memory_written = Signal()
#: A live memory forgotten (``forget``, ``forget_session``): ``session_id``, ``key``.
memory_forgotten = Signal()
#: A live memory expired: ``session_id``, ``key`` -- by ``expire``, or once its TTL passed, by
#: ``purge_expired``.
memory_expired = Signal()
#: Items appended to a log (``append``, ``append_with``): ``session_id``, ``stream``, ``items``
#: (:class:`~agentmemory.LogItemRecord`, in order).
log_appended = Signal()
#: Every memory and log of a session deleted (``erase_session``): ``session_id``.
session_erased = Signal()


def after_commit(signal: Signal, using: str, **kwargs: Any) -> None:
    """Send ``signal`` once the current transaction of ``using`` commits (at once outside
    one); nothing is registered when it has no receiver."""
    if not signal.receivers:
        return
    transaction.on_commit(functools.partial(_send, signal, using, kwargs), using=using)


def _send(signal: Signal, using: str, kwargs: dict[str, Any]) -> None:
    from .store import MemoryStore

    for receiver, result in signal.send_robust(sender=MemoryStore, using=using, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "a receiver of agentmemory's %s failed (%r); the change is committed",
                _name(signal),
                receiver,
                exc_info=result,
            )


def _name(signal: Signal) -> str:
    return next((name for name, value in globals().items() if value is signal), "signal")
