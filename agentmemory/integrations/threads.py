"""The frameworks call the store from threads of their own (LangGraph's node workers), where
Django never ends a request: what a call in such a thread owes the process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from .. import aio


@contextmanager
def released(owner: str, using: str, use: str) -> Iterator[None]:
    """Run a synchronous call of ``owner`` (the adapter's class name) on database ``using``.

    A synchronous call on a running event loop would block it on the database: refused as
    LangGraph's own async stores and savers refuse it (``asyncio.InvalidStateError``), naming
    ``use``, the asynchronous method to await instead. After the call, a thread other than the
    main one and the store's own pool (:mod:`agentmemory.aio`, whose threads keep one connection
    each) releases its connection as a request's end would: ``CONN_MAX_AGE`` decides whether
    that closes it -- so threads that come and go do not leave a connection each behind."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop in this thread: a synchronous caller, as it should be
    else:
        raise asyncio.InvalidStateError(
            f"Synchronous calls to {owner} detected in a running event loop: they would block "
            f"it on the database. Use the asynchronous interface: {use}."
        )
    try:
        yield
    finally:
        thread = threading.current_thread()
        connection = connections[using]
        if (
            thread is not threading.main_thread()
            and not thread.name.startswith(aio.THREAD_PREFIX)
            and not connection.in_atomic_block
        ):
            connection.close_if_unusable_or_obsolete()
