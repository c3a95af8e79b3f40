"""Sessions placed over several databases -- shards -- by their session id.

Every guarantee of the store holds within one session: a memory's versions, a log's items, a
checkpoint chain, an idempotency key's single write. No call needs two sessions in one
transaction, so the session id is the shard key: all of one session's rows live on one database
(its *shard*), each shard a database of its own (a server, a Galera cluster, a PostgreSQL HA
cluster), and every guarantee holds there as on a single database.

:func:`place` chooses a session's shard by rendezvous hashing (highest random weight): of the
shards' aliases, the one whose weight for the session id is highest (a weight: the session id's
BLAKE2b hash and the alias's, mixed by SplitMix64's finalizer). Every process with the same
list of aliases -- in any order -- places every session on the same shard, with no table to read
and nothing to share. Adding a shard moves only the sessions that now hash highest on it (a
fraction 1/(n+1) of them); removing one moves only its own. The aliases are the shards' names:
renaming one moves its sessions.

:class:`ShardedStore` is the :class:`~agentmemory.store.MemoryStore` API over
``AGENTMEMORY["SHARDS"]`` (or the aliases it is given): a call about one session goes to that
session's shard, unchanged; a call about every session (``search_sessions``, ``purge_expired``,
``prune_history``, ``reindex``, ``expired_counts``) runs on each shard in turn and adds up what
they answered -- :meth:`ShardedStore.each_shard` gives each shard's answer by alias. A shard
that cannot answer fails the call that needs it, with its alias in the error; the other shards'
sessions go on being served.

The adapters take either store. LangGraph's checkpointer places each thread's chains on its
thread id's shard (:class:`ShardedCheckpoints`: a listing of every thread merges the shards';
``delete_for_runs`` runs on each; ``copy_thread`` copies across two shards). ADK's session
service keeps an app's listing and each session in one transaction, so it takes one shard's store.

Sessions move between shards online (:meth:`ShardedStore.move`, :mod:`agentmemory.moves`): each
shard's store is *gated* -- its writes pass their session's gate -- and a call that finds its
session moved follows it to the shard it lives on (:meth:`ShardedStore.follow`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone

from . import aio, moves, validation
from .checkpoints import refuse_delta_threads
from .conf import get_config
from .defects import Defect
from .errors import InvalidMemory, MemoryUnavailable, SessionMoved
from .records import ScoredMemory
from .semantic import Index
from .store import _CACHE_FROM_SETTINGS, _INDEX_FROM_SETTINGS, MemoryStore
from .vendors import insert_if_missing

__all__ = [
    "ShardedStore",
    "check_shards",
    "forget_checked",
    "place",
    "record_shards",
    "recorded_shards",
]


_MASK = (1 << 64) - 1


def _digest(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8, person=b"agentmemory-shd").digest()
    )


@functools.lru_cache(maxsize=1024)
def _seed(alias: str) -> int:
    return _digest(alias)


def _weight(session: int, alias: str) -> int:
    # SplitMix64's finalizer of the session's hash and the shard's: a bijection that spreads
    # every input bit over the output, so each shard's weights are independent of the others'.
    x = session ^ _seed(alias)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=65536)
def _place(session_id: str, shards: tuple[str, ...]) -> str:
    session = _digest(session_id)
    return max(shards, key=lambda alias: (_weight(session, alias), alias))


def place(session_id: str, shards: Sequence[str]) -> str:
    """The alias, among ``shards``, of the database that holds ``session_id``'s rows: the same
    in every process and for every order of ``shards`` (rendezvous hashing; see the module)."""
    return _place(session_id, tuple(sorted(shards)))


#: (alias, shards) this process has checked against the alias's recorded list.
_verified: set[tuple[str, tuple[str, ...]]] = set()
_verifying = threading.Lock()


def forget_checked() -> None:
    """Check each shard's recorded list again at its next call in this process (each is checked
    once per process: after ``agentmemory_shards set``, or in tests that empty the databases)."""
    _verified.clear()


def recorded_shards(alias: str) -> list[str] | None:
    """The list of shards recorded in the database ``alias`` (:class:`~agentmemory.models.
    ShardMap`), or None if none is."""
    from .models import ShardMap

    found = ShardMap.objects.using(alias).filter(pk=ShardMap.ONLY).values_list("shards", flat=True)
    return next(iter(found), None)


def record_shards(alias: str, shards: Sequence[str]) -> None:
    """Record ``shards`` (sorted) as the list the database ``alias``'s sessions are placed over,
    replacing what was recorded (``manage.py agentmemory_shards set``)."""
    from .models import ShardMap

    ShardMap.objects.using(alias).update_or_create(
        pk=ShardMap.ONLY, defaults={"shards": sorted(shards), "recorded_at": timezone.now()}
    )
    forget_checked()


def _verify(store: MemoryStore, shards: tuple[str, ...]) -> None:
    """Refuse a shard whose recorded list of shards is not ``shards`` (the first to use it
    records it): a process placing sessions over another list would split their calls."""
    alias = store.using
    if (alias, shards) in _verified:
        return
    from .models import ShardMap

    with _verifying:
        if (alias, shards) in _verified:
            return

        def read_or_record() -> list[str]:
            found = recorded_shards(alias)
            if found is None:
                insert_if_missing(
                    connections[alias],
                    ShardMap,
                    {"id": ShardMap.ONLY, "shards": list(shards), "recorded_at": timezone.now()},
                )
                found = recorded_shards(alias)
            assert found is not None
            return found

        found = store._retrier.read(read_or_record)
        if tuple(found) != shards:
            raise ImproperlyConfigured(
                f"shard {alias!r} places sessions over shards {found}, this process over "
                f"{list(shards)}: every process must have the same AGENTMEMORY['SHARDS'] (a "
                "changed list: `manage.py agentmemory_shards set`, docs/scaling.md)"
            )
        _verified.add((alias, shards))


def check_shards(shards: Any) -> tuple[str, ...]:
    """``shards`` as a tuple of aliases of ``DATABASES``, or ImproperlyConfigured naming what is
    wrong: not a list or tuple of str, empty, a repeated alias, an alias that is not a database."""
    if isinstance(shards, str) or not isinstance(shards, (list, tuple)):
        raise ImproperlyConfigured(
            f"AGENTMEMORY['SHARDS'] must be a list of database aliases, got {shards!r}"
        )
    if not shards:
        raise ImproperlyConfigured("AGENTMEMORY['SHARDS'] is empty: name at least one database")
    for alias in shards:
        if not isinstance(alias, str) or not alias:
            raise ImproperlyConfigured(
                f"AGENTMEMORY['SHARDS'] holds {alias!r}: each shard is a database alias (a str)"
            )
        if alias not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"AGENTMEMORY['SHARDS'] names {alias!r}, which is not in DATABASES "
                f"({', '.join(settings.DATABASES)})"
            )
    repeated = sorted(alias for alias, n in Counter(shards).items() if n > 1)
    if repeated:
        raise ImproperlyConfigured(f"AGENTMEMORY['SHARDS'] names {repeated[0]!r} twice")
    return tuple(shards)


# The MemoryStore methods whose first argument is the session id: each runs on that session's
# shard, as it is.
PER_SESSION = (
    "remember",
    "update",
    "remember_many",
    "revert",
    "forget",
    "expire",
    "forget_session",
    "erase_session",
    "append",
    "pop",
    "clear_log",
    "rewrite_log",
    "append_with",
    "read_log",
    "log_length",
    "log_streams",
    "log_history",
    "recall",
    "recall_many",
    "history",
    "search",
)


def _named(alias: str, error: MemoryUnavailable) -> MemoryUnavailable:
    """``error`` with the shard's alias first in its message (its cause and attempts kept)."""
    return MemoryUnavailable(
        f"shard {alias!r}: {error}", cause=error.cause, attempts=error.attempts
    )


#: The per-session calls that read (or, as ``forget_session``, change only what they read): an
#: empty answer from a shard may mean that the session was moved away, so its gate is asked.
READS = frozenset(
    {
        "recall",
        "recall_many",
        "history",
        "search",
        "read_log",
        "log_length",
        "log_streams",
        "log_history",
        "forget_session",
    }
)

#: The reads of several statements, whose row ids one statement passes to the next: a session
#: moved away and back between them has new ids, so such a read compares the shard's count of
#: moves before and after (:func:`agentmemory.moves.moves_out`) and reads again if it changed.
SEVERAL_STATEMENTS = frozenset(
    {"recall_many", "history", "search", "read_log", "log_history", "forget_session"}
)

#: How many times one call follows its session to another shard before it gives up: a session
#: moved again while the call follows it is followed again.
MAX_HOPS = 32

#: How many moved sessions a ShardedStore remembers the shard of (then it forgets them all and
#: learns them again, one gate read each).
FORWARDS_MAX = 65536


def _routed(name: str) -> Callable[..., Any]:
    method = getattr(MemoryStore, name)
    read = name in READS
    several = name in SEVERAL_STATEMENTS

    @functools.wraps(method)
    def routed(self: ShardedStore, *args: Any, **kwargs: Any) -> Any:
        if args:
            session_id = args[0]
        elif "session_id" in kwargs:
            session_id = kwargs["session_id"]
        else:
            raise TypeError(f"{name}() missing required argument: 'session_id'")
        return self.follow(
            session_id,
            lambda store: getattr(store, name)(*args, **kwargs),
            read=read,
            several=several,
        )

    return routed


class ShardedStore:
    """The :class:`~agentmemory.store.MemoryStore` API with each session on its shard (see the
    module). ``shards``: the database aliases (default ``AGENTMEMORY["SHARDS"]``); ``cache``,
    ``index``, ``namespace``, ``row_lock`` and ``defects`` as for MemoryStore, given to each
    shard's store. On one Redis, each shard's entries, fence and epoch are its own (a tier's
    names start with its database's identity)."""

    def __init__(
        self,
        shards: Sequence[str] | None = None,
        cache: str | None = _CACHE_FROM_SETTINGS,
        *,
        namespace: str | None = None,
        row_lock: bool = True,
        defects: Iterable[Defect | str] = (),
        index: Index | None = _INDEX_FROM_SETTINGS,
    ) -> None:
        aliases = check_shards(get_config()["SHARDS"] if shards is None else shards)
        self.shards: tuple[str, ...] = tuple(sorted(aliases))
        defects = tuple(defects)
        #: Each shard's store, by alias.
        self.stores: dict[str, MemoryStore] = {
            alias: MemoryStore(
                using=alias,
                cache=cache,
                namespace=namespace,
                row_lock=row_lock,
                defects=defects,
                index=index,
                gated=True,
            )
            for alias in self.shards
        }
        #: Where the sessions this process saw moved (manage.py move_sessions) live now.
        self._forwards: dict[str, str] = {}
        self._local = threading.local()
        first = self.stores[self.shards[0]]
        #: The planted bugs and the semantic index, as every shard's store has them.
        self.defects = first.defects
        self.index = first.index
        #: The checkpoint chains, each thread's on its thread id's shard.
        self.checkpoints = ShardedCheckpoints(self)

    def __repr__(self) -> str:
        return f"<ShardedStore shards={list(self.shards)!r}>"

    # ------------------------------------------------------------------ placement

    def place(self, session_id: str) -> str:
        """The alias of ``session_id``'s home shard, where its placement puts it (InvalidMemory
        for an id the store refuses); a session moved away (:meth:`move`) lives elsewhere
        (:meth:`locate`)."""
        return _place(validation.check_session_id(session_id), self.shards)

    def locate(self, session_id: str) -> str:
        """The alias of the shard that holds ``session_id``'s rows: its home, or where this
        process saw it moved to, else where the gates of its home (and of each shard it went on
        to) say it moved: exact when it returns, a read of a gate per shard it moved from."""
        home = self.place(session_id)  # the id checked first
        alias = self._forwards.get(session_id, home)
        for _hop in range(MAX_HOPS):
            peer = self._moved_from(alias, session_id)
            if peer is None:
                return alias
            self.moved(session_id, peer)
            alias = peer
        raise self._lost(session_id)

    def moved(self, session_id: str, alias: str) -> None:
        """Remember that ``session_id`` lives on ``alias`` (the mover, and a write or read that
        found it moved, tell the store so)."""
        if alias == _place(session_id, self.shards):
            self._forwards.pop(session_id, None)
            return
        if len(self._forwards) >= FORWARDS_MAX:
            self._forwards.clear()
        self._forwards[session_id] = alias

    def follow(
        self,
        session_id: str,
        call: Callable[[MemoryStore], Any],
        *,
        read: bool = False,
        several: bool = False,
    ) -> Any:
        """``call(store)`` on the store of the shard ``session_id`` lives on, as this process
        knows it: where a write finds the session moved (``SessionMoved``), or a ``read`` finds
        nothing and the shard's gate says it moved, the call goes on to the shard it moved to.
        A read of ``several`` statements runs again if a session moved away from the shard
        while it ran (the shard's count of moves, read before and after, changed)."""
        home = self.place(session_id)  # the id checked first
        alias = self._forwards.get(session_id, home)
        for _hop in range(MAX_HOPS):
            try:
                store = self._checked(alias)
                before = self._moves_out(alias) if several else 0
                result = call(store)
                if several and self._moves_out(alias) != before:
                    continue  # a move ended meanwhile: read again, wherever it lives now
            except SessionMoved as moved:
                if any(connections[shard].in_atomic_block for shard in self.shards):
                    # In a transaction of the caller's on a shard, the call cannot go on to
                    # another shard: its rollback would not reach it.
                    raise MemoryUnavailable(
                        f"session {session_id!r} moved from shard {alias!r} to {moved.shard!r} "
                        "during a transaction of the caller's; retry the transaction"
                    ) from moved
                peer: str | None = moved.shard
            except MemoryUnavailable as error:
                raise _named(alias, error) from error
            else:
                if not read or result:
                    return result
                peer = self._moved_from(alias, session_id)
                if peer is None:
                    return result
            self.moved(session_id, peer)
            alias = peer
        raise self._lost(session_id)

    def _moves_out(self, alias: str) -> int:
        """How many sessions moved away from ``alias`` (read, retried; not named by it)."""
        return self.stores[alias]._retrier.read(lambda: moves.moves_out(alias))

    def _moved_from(self, alias: str, session_id: str) -> str | None:
        """Where ``session_id`` moved from ``alias`` (read, retried), MemoryUnavailable named
        by the shard."""
        try:
            return self.stores[alias]._retrier.read(lambda: moves.moved_to(alias, session_id))
        except MemoryUnavailable as error:
            raise _named(alias, error) from error

    def _lost(self, session_id: str) -> MemoryUnavailable:
        return MemoryUnavailable(
            f"session {session_id!r} was found moved {MAX_HOPS} times in one call (shards "
            f"{', '.join(self.shards)}): it is being moved back and forth faster than the call "
            "can follow"
        )

    def move(self, session_id: str, to: str) -> moves.MoveReport:
        """Move ``session_id`` to the shard ``to``, online: it is read throughout and its writes
        wait only while its rows are copied (docs/scaling.md). Returns what was moved. Raises
        InvalidMemory for a shard that is not one of this store's, MemoryUnavailable (naming the
        shard) if a database fails -- the move can then be made again, or finished by
        ``manage.py move_sessions --resume``."""
        session_id = validation.check_session_id(session_id)
        if to not in self.stores:
            raise InvalidMemory(
                "to", f"{to!r} is not a shard of this store ({', '.join(self.shards)})"
            )
        for alias in self.shards:
            _verify(self.stores[alias], self.shards)
        return moves.move_session(self, session_id, to)

    def shard(self, session_id: str) -> MemoryStore:
        """The store of ``session_id``'s shard: every call about that session goes to it.
        ImproperlyConfigured if the shard records another list of shards than this store's
        (checked once per process and shard); MemoryUnavailable naming the shard if its
        database cannot be asked."""
        alias = self.locate(session_id)
        try:
            return self._checked(alias)
        except MemoryUnavailable as error:
            raise _named(alias, error) from error

    def _checked(self, alias: str) -> MemoryStore:
        store = self.stores[alias]
        _verify(store, self.shards)
        self._local.store = store
        return store

    # ------------------------------------------------------------------ every shard

    def each_shard(self, call: Callable[[MemoryStore], Any]) -> dict[str, Any]:
        """``call(store)`` on each shard's store, in the order of their aliases: each shard's
        answer, by alias. A shard whose database cannot answer raises MemoryUnavailable naming
        it (the shards before it have run)."""
        answers = {}
        for alias, store in self.stores.items():
            try:
                _verify(store, self.shards)
                answers[alias] = call(store)
            except MemoryUnavailable as error:
                raise _named(alias, error) from error
        return answers

    def search_sessions(
        self,
        session_prefix: str,
        query: str,
        *,
        prefix: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ScoredMemory]:
        """:meth:`MemoryStore.search_sessions` over every shard: the ``limit`` best after
        ``offset`` of all of them (each shard asked for its ``offset + limit`` best). Equal
        scores: the memory created first, first."""
        first = self.stores[self.shards[0]]
        first._check_search(query, prefix, filter, limit, offset)  # bad input: no shard asked
        session_prefix = validation.check_prefix(session_prefix)
        wanted = offset + limit

        def best(store: MemoryStore) -> list[ScoredMemory]:
            # The shard's ``wanted`` best, a page of at most SEARCH_LIMIT_MAX at a time.
            hits: list[ScoredMemory] = []
            while len(hits) < wanted:
                asked = min(validation.SEARCH_LIMIT_MAX, wanted - len(hits))
                page = store.search_sessions(
                    session_prefix,
                    query,
                    prefix=prefix,
                    filter=filter,
                    limit=asked,
                    offset=len(hits),
                )
                hits += page
                if len(page) < asked:
                    break
            return hits

        found = self.each_shard(best)
        merged = heapq.merge(
            *found.values(),
            key=lambda hit: (-hit.score, hit.created_at, hit.session_id, hit.key),
        )
        # A session being moved is on two shards for a moment (its copy, then its rows deleted
        # from the shard it leaves): each memory once.
        seen: set[tuple[str, str]] = set()
        hits = []
        for hit in merged:
            if (hit.session_id, hit.key) not in seen:
                seen.add((hit.session_id, hit.key))
                hits.append(hit)
        return hits[offset : offset + limit]

    def purge_expired(
        self,
        *,
        batch: int = 1000,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """:meth:`MemoryStore.purge_expired` on each shard in turn: how many expired, in all.
        ``progress(done, total)`` counts over every shard."""
        return sum(
            self.each_shard(
                _over_shards(progress, "purge_expired", batch=batch, dry_run=dry_run)
            ).values()
        )

    def expired_counts(self) -> tuple[int, int]:
        """:meth:`MemoryStore.expired_counts`, added over the shards."""
        counts = self.each_shard(lambda store: store.expired_counts()).values()
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def prune_history(
        self,
        *,
        keep_last: int | None = None,
        keep_days: float | None = None,
        batch: int = 1000,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        session_id: str | None = None,
    ) -> int:
        """:meth:`MemoryStore.prune_history` on each shard (on ``session_id``'s only, if given)."""
        options = {
            "keep_last": keep_last,
            "keep_days": keep_days,
            "batch": batch,
            "dry_run": dry_run,
        }
        if session_id is not None:
            return self.shard(session_id).prune_history(
                **options, progress=progress, session_id=session_id
            )
        return sum(self.each_shard(_over_shards(progress, "prune_history", **options)).values())

    def reindex(
        self,
        *,
        batch: int = 500,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        session_id: str | None = None,
    ) -> int:
        """:meth:`MemoryStore.reindex` on each shard (on ``session_id``'s only, if given)."""
        if session_id is not None:
            return self.shard(session_id).reindex(
                batch=batch, dry_run=dry_run, progress=progress, session_id=session_id
            )
        return sum(
            self.each_shard(
                _over_shards(progress, "reindex", batch=batch, dry_run=dry_run)
            ).values()
        )

    # ------------------------------------------------------------------ diagnostics

    @property
    def retries(self) -> Counter[str]:
        """Transient errors absorbed by retries, by kind, over every shard."""
        total: Counter[str] = Counter()
        for store in self.stores.values():
            total.update(store.retries)
        return total

    @property
    def last_read_source(self) -> str | None:
        """Where this thread's last read was answered from, on the shard it went to."""
        store = getattr(self._local, "store", None)
        return None if store is None else store.last_read_source


#: The head id no checkpoint chain has (ids start at 1), and one past every id: a listing's
#: cursor on the shards before and after the last one it returned (see ShardedCheckpoints.page).
_BEFORE_EVERY_ID, _AFTER_EVERY_ID = 0, (1 << 63) - 1


class ShardedCheckpoints:
    """:class:`~agentmemory.checkpoints.CheckpointPath` over the shards: every chain of a thread on
    its thread id's shard (placed as a session id is), so a put, its pending writes, a read and
    a thread's listing are one shard's, with every guarantee of one database. Across threads:
    ``delete_threads`` and ``prune`` go to each thread's shard, ``delete_runs`` to every shard, a
    listing of every thread merges the shards' newest first, and ``copy_thread`` between two
    shards copies the source's rows into the target's shard (all or nothing there)."""

    def __init__(self, store: ShardedStore) -> None:
        self.store = store

    def alias(self, thread_id: str) -> str:
        return self.store.locate(thread_id)

    def _thread(self, thread_id: str, call: Callable[[Any], Any], *, read: bool = False) -> Any:
        """``call(the chains of the thread's shard)``, following the thread if it moved (a read
        of a chain is several statements: see :meth:`ShardedStore.follow`)."""
        return self.store.follow(
            thread_id, lambda store: call(store.checkpoints), read=read, several=read
        )

    def of(self, thread_id: str) -> Any:
        """The chains of ``thread_id``'s shard."""
        return self._path(self.alias(thread_id))

    def _path(self, alias: str) -> Any:
        try:
            return self.store._checked(alias).checkpoints
        except MemoryUnavailable as error:
            raise _named(alias, error) from error

    def _on(self, alias: str, call: Callable[[Any], Any]) -> Any:
        """``call(the shard's chains)``, a ``MemoryUnavailable`` named once by the shard."""
        try:
            return call(self.store._checked(alias).checkpoints)
        except MemoryUnavailable as error:
            raise _named(alias, error) from error

    def _by_shard(self, thread_ids: Iterable[str]) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for thread_id in thread_ids:
            grouped.setdefault(self.alias(thread_id), []).append(thread_id)
        return grouped

    def put(self, thread_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._thread(thread_id, lambda p: p.put(thread_id, *args, **kwargs))

    def put_writes(self, thread_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._thread(thread_id, lambda p: p.put_writes(thread_id, *args, **kwargs))

    def get(self, thread_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._thread(thread_id, lambda p: p.get(thread_id, *args, **kwargs), read=True)

    def delta_history(self, thread_id: str, *args: Any, **kwargs: Any) -> Any:
        return self._thread(
            thread_id, lambda p: p.delta_history(thread_id, *args, **kwargs), read=True
        )

    def _again_if_moved(self, work: Callable[[], Any]) -> Any:
        """``work()`` (a call over several threads, each part of which can be done again), again
        if a thread moved to another shard while it ran."""
        for _try in range(len(self.store.shards)):
            try:
                return work()
            except SessionMoved as moved:
                self.store.moved(moved.session_id, moved.shard)
        return work()

    def delete_threads(self, thread_ids: Iterable[str]) -> None:
        thread_ids = list(thread_ids)

        def work() -> None:
            for alias, ids in sorted(self._by_shard(thread_ids).items()):
                self._on(alias, lambda p, ids=ids: p.delete_threads(ids))

        self._again_if_moved(work)

    def delete_runs(self, run_ids: Iterable[str]) -> None:
        run_ids = list(run_ids)

        def work() -> None:
            for alias in self.store.shards:
                self._on(alias, lambda p: p.delete_runs(run_ids))

        self._again_if_moved(work)

    def prune(
        self,
        thread_ids: Iterable[str],
        *,
        keep_latest: bool,
        needs_history: Callable[[Any], bool] | None = None,
    ) -> None:
        """Each shard's threads pruned on that shard -- after every shard was asked whether one
        uses a ``DeltaChannel``: if one does, nothing is pruned anywhere (``NotImplementedError``
        naming them, as on one database)."""
        thread_ids = list(thread_ids)
        self._again_if_moved(lambda: self._prune(thread_ids, keep_latest, needs_history))

    def _prune(
        self,
        thread_ids: list[str],
        keep_latest: bool,
        needs_history: Callable[[Any], bool] | None,
    ) -> None:
        grouped = sorted(self._by_shard(thread_ids).items())
        if keep_latest and needs_history is not None:
            refused: set[str] = set()
            for alias, ids in grouped:
                refused |= self._on(alias, lambda p, ids=ids: p.delta_threads(ids, needs_history))
            refuse_delta_threads(refused)
        for alias, ids in grouped:
            self._on(
                alias,
                lambda p, ids=ids: p.prune(
                    ids, keep_latest=keep_latest, needs_history=needs_history
                ),
            )

    def copy_thread(self, source: str, target: str) -> None:
        self._again_if_moved(lambda: self._copy_thread(source, target))

    def _copy_thread(self, source: str, target: str) -> None:
        origin, destination = self.alias(source), self.alias(target)
        if origin == destination:
            self._on(destination, lambda p: p.copy_thread(source, target))
            return
        self._path(origin)  # the source's shard checked too
        before = self._on(origin, lambda _p: self.store._moves_out(origin))
        self._on(destination, lambda p: p.copy_thread(source, target, source_using=origin))
        if self._on(origin, lambda _p: self.store._moves_out(origin)) != before:
            # A thread moved away from the source's shard while it was read: if it was the
            # source, the copy may be short -- made again, from where it lives now.
            peer = self.store._moved_from(origin, source) or origin
            raise SessionMoved(source, origin, peer)

    def page(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        after: tuple[Any, ...] | None,
        size: int,
    ) -> list[Any]:
        """A thread's page from its shard; every thread's, merged from every shard in one order
        -- newest checkpoint id first, then the shards' aliases, then each shard's own order --
        whose cursor is (checkpoint id, head id, alias): each shard continues from where that
        order left it (its own cursor on the last one's shard; before or after every row of the
        same id on the others)."""
        if thread_id is not None:
            return self._thread(
                thread_id,
                lambda p: p.page(thread_id, checkpoint_ns, checkpoint_id, before, after, size),
                read=True,
            )
        pages = []
        for alias in self.store.shards:
            mine: tuple[str, int] | None = None
            if after is not None:
                last_id, last_head, last_alias = after
                head = (
                    last_head
                    if alias == last_alias
                    else _BEFORE_EVERY_ID
                    if alias < last_alias
                    else _AFTER_EVERY_ID
                )
                mine = (last_id, head)
            found = self._on(
                alias,
                lambda p, mine=mine: p.page(None, checkpoint_ns, checkpoint_id, before, mine, size),
            )
            pages.append([(row.checkpoint_id, alias, row.cursor[1], row) for row in found])
        merged = heapq.merge(*pages, key=lambda item: (_descending(item[0]), item[1], -item[2]))
        return [
            dataclasses.replace(row, cursor=(row.cursor[0], head, alias))
            for _, alias, head, row in itertools.islice(merged, size)
        ]


def _descending(text: str) -> tuple[int, ...]:
    """A sort key that orders strings from the greatest down (code points negated)."""
    return (*(-ord(char) for char in text), 1)


def _twin(name: str) -> Callable[..., Any]:
    """The async twin ``a<name>``: the sync call on the store's pool of threads, as
    MemoryStore's twins run (placing a session checks its shard's database, so it never runs on
    the event loop's thread)."""
    method = getattr(MemoryStore, f"a{name}")

    @functools.wraps(method)
    async def twin(self: ShardedStore, *args: Any, **kwargs: Any) -> Any:
        return await aio.run(getattr(self, name), *args, **kwargs)

    return twin


for _name in PER_SESSION:
    setattr(ShardedStore, _name, _routed(_name))
    if hasattr(MemoryStore, f"a{_name}"):
        setattr(ShardedStore, f"a{_name}", _twin(_name))
ShardedStore.asearch_sessions = _twin("search_sessions")  # type: ignore[attr-defined]


def _over_shards(
    progress: Callable[[int, int], None] | None, method: str, **options: Any
) -> Callable[[MemoryStore], Any]:
    """A call of ``method`` for :meth:`ShardedStore.each_shard` whose ``progress`` counts on
    from what the shards before it did."""
    state = {"before": 0, "done": 0}

    def call(store: MemoryStore) -> Any:
        state["before"] += state["done"]
        state["done"] = 0

        def step(done: int, total: int) -> None:
            state["done"] = done
            assert progress is not None
            progress(state["before"] + done, state["before"] + total)

        return getattr(store, method)(**options, progress=step if progress else None)

    return call
