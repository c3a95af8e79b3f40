"""memcheck's nemesis: faults injected on a schedule while the workload runs, then healed.

Four kinds, on servers of this machine only (loopback), so a memcheck run can never disturb a
remote server:

* ``db-kill``: kill one of the workload's database connections server-side (``KILL CONNECTION`` on
  MySQL/MariaDB/TiDB, ``pg_terminate_backend`` on PostgreSQL), whatever it is doing -- usually in
  the middle of a transaction. Not on SQLite, which has no server.
* ``db-lock``: hold the row locks of one session's hot keys and log heads (``SELECT ... FOR
  UPDATE``) longer than the workers' lock wait (memcheck lowers it to one second on its own
  connections): writers time out (1205, 55P03) and must retry. On SQLite it holds the database's write lock
  (``BEGIN IMMEDIATE``) for as long: writers queue behind it within their busy timeout (a shorter
  busy timeout makes SQLite's unfair busy handler starve writers for seconds).
Cache faults never touch the Redis the project is configured with: for them memcheck starts a
Redis of its own for the run (:class:`~agentmemory.consistency.redis_servers.SentinelGroup`: a
primary with RDB snapshots, a replica and three sentinels, on free loopback ports) and points the
store's cache tier at it, with the configured cache's options:

* ``cache-kill``: close the store's Redis connections server-side (``CLIENT KILL ADDR``).
* ``cache-pause``: ``CLIENT PAUSE`` the primary for longer than the client's socket timeout: every
  cache call in flight times out, and Redis comes back later with whatever it held.
* ``cache-restart``: the primary takes a snapshot, acknowledges more writes, then is ``kill -9``-ed
  and started again at once from that snapshot: a new process of the same server, back with
  entries its predecessor stored and older than what it acknowledged since.
* ``cache-failover``: ``kill -9`` the primary; the sentinels promote the replica (whatever it had
  not received is lost); the old primary rejoins as the new replica.

Two more wherever a cache tier is configured (every mode but ``none``), since they are harmless
on the project's own Redis: they touch only the run's throw-away keys.

* ``foreign-entry``: write into Redis an older version of one of the run's memories, stamped with
  the identity of another Redis server process -- what a Redis restarted from an old snapshot,
  or a replica promoted before it received the newest writes, hands back. A tier that trusted
  it (one that skipped the server-identity check) serves a stale read.
* ``redis-clock``: Redis' clock steps back -- the entries of memories that expire live ten
  seconds longer than their memories (``PEXPIRE``): a memory of the fault's own, served from
  Redis, then read once it has expired, and the run's own, for the final reads. A tier that did
  not check a hit's expiry itself, trusting Redis' TTL, serves an expired memory.

And with a cache tier, under ``--faults db``, ``all`` or ``orm``:

* ``orm-bulk``: ORM writes of memories the tier holds -- a queryset ``delete()``, an ``update()``
  that expires them -- on memories of the fault's own, read through the store right after they
  commit: a read that returns what the ORM deleted or expired is an ``orm-bulk`` anomaly.

On a PostgreSQL HA cluster under Patroni on this machine (one alias over several hosts, which
follows the primary), ``--faults db`` adds one more:

* ``db-failover``: the primary stops replicating for half a second, then crashes (Patroni and
  PostgreSQL killed); Patroni promotes a standby, the crashed node is started again and streams
  from it (:mod:`~agentmemory.consistency.pg_failover`). With asynchronous replication the writes
  acknowledged in that half second are lost by the database: the checker reports them as
  ``lost-by-database``, apart from anything the store or its cache did. The same on a MariaDB
  primary with an asynchronous GTID replica behind a router on this machine
  (:mod:`~agentmemory.consistency.mysql_pair`): the replica stops receiving for half a second,
  the primary is killed, the replica promoted and the router pointed at it -- with no timeline
  to show it, so reads may show what it lost until the tier's bound (two fence periods).

On a cluster (``--database default,node2,node3``, MariaDB Galera nodes on this machine), two more:

* ``node-kill``: ``kill -9`` one node's server (never the first alias's), start it again with the
  same command line, and wait until it reports ``Synced``;
* ``node-pause``: ``SIGSTOP`` one node's server for longer than the clients' timeouts (memcheck
  gives its own connections a 2-second timeout on a cluster) but shorter than Galera's suspect
  timeout, then ``SIGCONT`` it.

After each node fault the nemesis waits until every node reports ``Synced`` in a cluster of
all of them before it goes on.

Kills are per process (each process knows its own connections); locks, pauses and node faults
affect the whole server, so only the parent process injects them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.signals import connection_created
from django.db.models import F

from .. import clock, defects
from ..cache import is_cluster_alias
from ..defects import Defect
from ..models import Log, Memory
from ..records import VALUE_OPS
from ..vendors import (
    Transient,
    classify,
    flavor,
    kill_connection,
    server_connection_id,
    set_lock_wait,
)
from . import dumps, mysql_pair
from .checker import Anomaly
from .nodes import (
    LOOPBACK,
    NodeUnavailable,
    kill_and_restart,
    local_node,
    pause,
    wait_cluster_synced,
)
from .pg_failover import Failover, check_local_cluster, fail_over, is_ha_alias
from .redis_servers import ClusterGroup

DB_FAULTS = ("db-kill", "db-lock")
CACHE_FAULTS = ("cache-kill", "cache-pause", "cache-restart", "cache-failover")
#: On a Redis Cluster, besides: a group's slot moved to another primary under traffic, and a
#: whole shard (a primary and its replica) down a moment.
CLUSTER_FAULTS = ("cache-migrate", "cache-shard-down")
NODE_FAULTS = ("node-kill", "node-pause")
FAULTS = {
    "none": (),
    # The cheapest: competing locks held a moment (memcheck's default where it can run).
    "lock": ("db-lock",),
    "db": DB_FAULTS,
    "cache": CACHE_FAULTS,
    "all": DB_FAULTS + CACHE_FAULTS,
    # The database taken back in time: a dump of the run's sessions put back a moment later, its
    # losses the database's own (lost-by-database). Apart from "db" and "all", whose runs must
    # lose nothing.
    "restore": ("db-restore",),
    # ORM writes of memories the tier serves (orm-bulk): with a cache tier, "db" and "all" run it
    # too; alone, for the self-test's variant that needs it.
    "orm": (),
}
#: Seconds a paused node stays stopped, and the timeout memcheck's clients get on a cluster.
# The pause stays under Galera's default evs.suspect_timeout (5 s): the node stalls the cluster
# as a long GC pause would, without being evicted.
NODE_PAUSE_SECONDS = 4.0
CLIENT_TIMEOUT_SECONDS = 2
#: The faults one process can inject on its own connections; the others affect the whole server.
LOCAL_FAULTS = frozenset({"db-kill", "cache-kill"})
#: Thread-name prefix of the workload's clients: only their connections are killed or tuned.
WORKER_THREAD_PREFIX = "memcheck-client-"

#: The redis-clock fault: how far Redis' clock steps back, and the TTL of its own memory (long
#: enough for it to be served from Redis first).
CLOCK_STEP_SECONDS = 10.0
CLOCK_TTL_SECONDS = 1.0

#: How long the writer-crash, cache-evict and fence-race faults wait for the thread they stop.
HOLD_SECONDS = 5.0
#: Faults that play out on sessions of their own, each a race its holds make happen: injected
#: once the workload's clients are done, one after the other, before the final reads -- they need
#: no traffic, and fence-race needs the tier to itself (a fence renewal of the clients' would
#: replay what it leaves pending). In the schedule they only lengthened a run's round of faults.
QUIET_FAULTS = frozenset({"redis-clock", "writer-crash", "cache-evict", "fence-race"})
#: How many times a quiet fault sets up its race before it reports why it could not.
QUIET_ATTEMPTS = 3

#: The server identity (``run_id``) the foreign-entry fault stamps: no Redis process has it.
FOREIGN_RUN_ID = "0" * 40

#: How long after its dump the db-restore fault puts it back, and what it allows past the tier's
#: bound (two fence periods) for the renewal's own round trips.
RESTORE_AFTER_SECONDS = (0.3, 0.8)
RESTORE_MARGIN_SECONDS = 0.5

LOCK_WAIT_SECONDS = 1
LOCK_HOLD_SECONDS = 1.2
PAUSE_SECONDS = 0.6


class Unstaged(Exception):
    """A quiet fault could not set up its race (Redis never served the key, a held thread
    never reached its point): tried again, then reported as an error -- never a silent no-op."""


class FaultsUnavailable(Exception):
    """The requested faults cannot run against this configuration (the reason is the message)."""


def fault_kinds(mode: str, database: str, cache: Any, nodes: Iterable[str] = ()) -> tuple[str, ...]:
    """The faults ``--faults mode`` injects here; raises :class:`FaultsUnavailable` for a server
    that is not on this machine, or for cache faults without a cache tier. ``nodes``: the other
    aliases of a cluster run; with ``db`` or ``all`` their servers are faulted too."""
    kinds = FAULTS[mode]
    nodes = list(nodes)
    if nodes and mode in ("db", "all"):
        for alias in nodes:
            try:
                local_node(alias)
            except NodeUnavailable as exc:
                raise FaultsUnavailable(f"--faults {mode} on a cluster: {exc}") from None
        kinds = kinds + NODE_FAULTS
    if mode in ("db", "all") and is_ha_alias(database):
        try:
            check_local_cluster(database)
        except NodeUnavailable as exc:
            raise FaultsUnavailable(f"--faults {mode} on a PostgreSQL HA cluster: {exc}") from None
        kinds = (*kinds, "db-failover")
    elif mode in ("db", "all") and mysql_pair.pair_of(database) is not None:
        kinds = (*kinds, "db-failover")
    connection = connections[database]
    if any(k.startswith("db-") for k in kinds) and connection.vendor != "sqlite":
        host = str(connection.settings_dict.get("HOST") or "")
        # libpq's host list (a PostgreSQL HA alias): every host of it on this machine.
        hosts = host.split(",") if connection.vendor == "postgresql" else [host]
        if not all(one in LOOPBACK or one.startswith("/") for one in hosts):
            raise FaultsUnavailable(
                f"--faults {mode} kills and locks connections, so it runs only against a database "
                f"on this machine; {database!r} is on {host!r}"
            )
    if any(k.startswith("cache-") for k in kinds) and cache is None:
        raise FaultsUnavailable(
            f"--faults {mode} breaks the Redis cache tier, and AGENTMEMORY['CACHE'] is not set"
        )
    if any(k.startswith("cache-") for k in kinds) and is_cluster_alias(cache.alias):
        kinds = (*kinds, *CLUSTER_FAULTS)
    if cache is not None and mode != "none":
        kinds = (
            *kinds,
            "foreign-entry",
            "redis-clock",
            "writer-crash",
            "cache-evict",
            "fence-race",
        )
    if cache is not None and mode in ("db", "all", "orm"):
        kinds = (*kinds, "orm-bulk")
    return kinds


class Nemesis:
    """Injects ``kinds`` one at a time, at seeded random moments about ``interval`` seconds apart
    and each kind once per round, until stopped; then heals.

    ``counts`` holds the faults actually injected, per kind (a kill that found no live connection
    does not count)."""

    def __init__(
        self,
        database: str,
        cache: Any,
        kinds: Iterable[str],
        *,
        sessions: list[str],
        seed: int = 0,
        interval: float = 1.0,
        nodes: Iterable[str] = (),
        redis: Any = None,
        defects: Iterable[Defect] = (),
    ) -> None:
        self.database, self.cache, self.sessions = database, cache, sessions
        #: The run's planted defects (a self-test variant): orm-bulk arms ORM_UNSEEN's seam.
        self.defects = frozenset(defects)
        #: What a fault saw for itself (orm-bulk): anomalies, beside the checker's.
        self.findings: list[Anomaly] = []
        self._orm_runs = 0
        self._own_runs = 0
        #: memcheck's own Redis (a SentinelGroup), which the cache faults act on.
        self.redis = redis
        #: The cluster's other aliases, whose servers the node faults take turns on.
        self.nodes = list(nodes)
        self.kinds = tuple(kinds)
        self.counts: Counter[str] = Counter()
        #: Each fault injected: (kind, started, ended), in the store's clock (POSIX seconds, as
        #: the history's times) -- the report shades them on its plots.
        self.windows: list[tuple[str, float, float]] = []
        self.errors: list[str] = []
        #: The failovers injected (``db-failover``): the checker tells the database's losses by
        #: them.
        self.failovers: list[Failover] = []
        self._rng = random.Random(f"nemesis-{seed}")
        self._interval = interval
        self._vendor = flavor(connections[database])
        # (alias, server-side id) -> the worker's connection wrapper
        self._ids: dict[tuple[str, int], Any] = {}
        self._ids_lock = threading.Lock()
        self._stop = threading.Event()
        #: Set once every kind was injected (or tried) once: a timed run lasts at least that long.
        self.round_done = threading.Event()
        self._looped = tuple(k for k in self.kinds if k not in QUIET_FAULTS)
        if not self._looped:
            self.round_done.set()
        self._admin: Any = None
        self._admin_port = 0
        self._thread = threading.Thread(target=self._loop, name="memcheck-nemesis", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Nemesis:
        if self.kinds:
            connection_created.connect(self._connected, dispatch_uid=f"nemesis-{id(self)}")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop injecting and heal: the lock is released and Redis unpaused before this returns."""
        if not self.kinds or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        connection_created.disconnect(dispatch_uid=f"nemesis-{id(self)}")
        if "cache-pause" in self.kinds:
            try:
                if isinstance(self.redis, ClusterGroup):
                    for node in self.redis.primaries():
                        admin = node.client()
                        admin.execute_command("CLIENT", "UNPAUSE")
                        admin.close()
                else:
                    self._redis_primary().execute_command("CLIENT", "UNPAUSE")
            except Exception as exc:  # reported; the run goes on
                self.errors.append(f"cache-pause: could not unpause: {exc}")
        if self._admin is not None:
            self._admin.close()
            self._admin.connection_pool.disconnect()
            self._admin = None

    # ------------------------------------------------------------------ the workers' connections

    def _connected(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        """Every new connection of a workload client: remember its server-side id and give it a
        short lock wait, so a held lock produces timeouts rather than a stall."""
        if connection.alias != self.database and connection.alias not in self.nodes:
            return
        if not threading.current_thread().name.startswith(WORKER_THREAD_PREFIX):
            return
        server_id = server_connection_id(connection)
        if server_id is None:  # SQLite: writers keep their busy timeout; a held lock waits
            return
        set_lock_wait(connection, LOCK_WAIT_SECONDS)
        with self._ids_lock:
            self._ids[(connection.alias, server_id)] = connection

    # ------------------------------------------------------------------ schedule

    def _loop(self) -> None:
        try:
            order: list[str] = []
            while not self._stop.wait(self._rng.uniform(0.5, 1.5) * self._interval):
                if not order:  # every kind once, in a seeded order, before any repeats
                    order = self._rng.sample(self._looped, len(self._looped))
                self._inject(order.pop())
                if not order:
                    self.round_done.set()
        finally:
            connections.close_all()

    def _inject(self, kind: str) -> None:
        started = clock.now().timestamp()
        try:
            if getattr(self, "_" + kind.replace("-", "_"))():
                self.counts[kind] += 1
                self.windows.append((kind, started, clock.now().timestamp()))
        except Unstaged:
            raise
        except Exception as exc:  # reported; the run goes on
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            connections.close_all()  # a connection the fault broke: a new one next time

    def after_workload(self) -> None:
        """The faults that need the tier to themselves (:data:`QUIET_FAULTS`), once the
        workload's clients are done. On new connections: this thread's may predate a fault
        of the workload's that broke them (a failover, a killed connection)."""
        connections.close_all()
        for kind in self.kinds:
            if kind not in QUIET_FAULTS:
                continue
            reasons = []
            for _attempt in range(QUIET_ATTEMPTS):
                try:
                    self._inject(kind)
                    break
                except Unstaged as exc:
                    reasons.append(str(exc))
            else:
                self.errors.append(
                    f"{kind}: not played out in {QUIET_ATTEMPTS} attempts: {'; '.join(reasons)}"
                )
        connections.close_all()

    def _db_kill(self) -> bool:
        if self._vendor == "sqlite":
            return False
        with self._ids_lock:
            candidates = list(self._ids)
        self._rng.shuffle(candidates)
        for alias, server_id in candidates:
            with self._ids_lock:
                self._ids.pop((alias, server_id), None)
            for _attempt in range(2):
                try:
                    # Killed from the same node: a connection id means something on its own server.
                    if kill_connection(connections[alias], server_id):
                        return True
                    break  # it had closed already: try another
                except DatabaseError:
                    # The killer's own connection failed (its node is down or paused, or it was
                    # aborted): once more on a new connection, then another candidate.
                    connections[alias].close()
        return False

    def _db_lock(self) -> bool:
        try:
            return self._hold_locks()
        except DatabaseError as exc:
            # On a Galera cluster a replicated write aborts the local lock holder (1213): the
            # lock was held until then, as the cluster allows.
            if classify(exc) is Transient.CONFLICT:
                return True
            raise

    def _hold_locks(self) -> bool:
        connection = connections[self.database]
        with transaction.atomic(using=self.database):
            if connection.vendor == "sqlite":
                # BEGIN IMMEDIATE took the write lock; a write makes sure of it on any mode.
                connection.cursor().execute("UPDATE agentmemory_memory SET id = id WHERE 0")
            else:
                hot = self._rng.choice(self.sessions)
                rows = [
                    row
                    for model in (Memory, Log)
                    for row in model.objects.using(self.database)
                    .select_for_update()
                    .filter(session_id=hot)
                    .values_list("id", flat=True)
                ]
                if not rows:
                    return False
            self._stop.wait(LOCK_HOLD_SECONDS)
        return True

    def _cache_kill(self) -> bool:
        if isinstance(self.redis, ClusterGroup):
            # Every client connection of every primary but the nemesis's own (only memcheck's
            # clients use memcheck's cluster).
            killed = 0
            for node in self.redis.primaries():
                admin = node.client()
                try:
                    killed += int(
                        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                        or 0
                    )
                finally:
                    admin.close()
            return killed > 0
        pool = self.cache.client.connection_pool
        with pool._lock:  # redis-py's pool: the connections it holds, idle and in use
            held = [*pool._available_connections, *pool._in_use_connections]
        sockets = [conn._sock for conn in held if getattr(conn, "_sock", None) is not None]
        admin, killed = self._redis_primary(), 0
        for sock in sockets:
            try:
                host, port = sock.getsockname()[:2]
            except OSError:
                continue
            killed += int(admin.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}") or 0)
        return killed > 0

    def _db_failover(self) -> bool:
        pair = mysql_pair.pair_of(self.database)
        try:
            failover = self._promote(pair) if pair else fail_over(self.database, self._stop)
        finally:
            connections.close_all()  # this thread's went with the old primary
        if failover is None:  # stopped before the crash
            return False
        self.failovers.append(failover)
        return True

    def _promote(self, pair: mysql_pair.Pair) -> Failover | None:
        """The MariaDB pair's replica promoted without the primary's last writes
        (:mod:`.mysql_pair`). No timeline moves: reads may show what it lost until the tier's
        bound (two fence periods) has passed, as after a restore, and never after."""
        done = mysql_pair.fail_over(pair, self._stop)
        if done is None:
            return None
        _, promoted_at, positions = done
        fence = self.cache.fence_seconds if self.cache is not None else 0.0
        return Failover(
            promoted_at,
            promoted_at + 2 * fence + RESTORE_MARGIN_SECONDS,
            positions,
            kind="promotion",
        )

    def _db_restore(self) -> bool:
        """A dump of the run's sessions (and the cache incarnation row), taken now and restored
        into the live database a moment later, by plain SQL (:mod:`.dumps`): every write
        acknowledged in between is lost, as after ``pg_restore``, a point-in-time recovery or a
        promoted asynchronous replica. Reads may show what it lost until the tier's documented
        bound has passed (two fence periods), and never after."""
        dumped_at = clock.now().timestamp()
        taken = dumps.dump(self.database, self.sessions)
        self._stop.wait(self._rng.uniform(*RESTORE_AFTER_SECONDS))
        for attempt in range(3):
            try:
                dumps.restore(taken)
                break
            except DatabaseError as exc:
                # A deadlock with the workload's writers (its rows deleted and inserted under
                # their locks): the restore is a transaction, retried as a whole.
                if classify(exc) is None or attempt == 2:
                    raise
        restored_at = clock.now().timestamp()
        fence = self.cache.fence_seconds if self.cache is not None else 0.0
        self.failovers.append(
            Failover(
                restored_at,
                restored_at + 2 * fence + RESTORE_MARGIN_SECONDS,
                ("", ""),
                kind="restore",
                lost_after=dumped_at,
            )
        )
        return True

    def _node_kill(self) -> bool:
        node = local_node(self._rng.choice(self.nodes))
        kill_and_restart(node)
        wait_cluster_synced([self.database, *self.nodes])
        return True

    def _node_pause(self) -> bool:
        node = local_node(self._rng.choice(self.nodes))
        pause(node, NODE_PAUSE_SECONDS)
        wait_cluster_synced([self.database, *self.nodes])
        return True

    def _cache_pause(self) -> bool:
        self._redis_primary().execute_command("CLIENT", "PAUSE", int(PAUSE_SECONDS * 1000), "ALL")
        self._stop.wait(PAUSE_SECONDS)
        return True

    def _cluster_slot(self, session_id: str | None = None) -> int:
        """The slot of a group holding ``session_id``, or one of the run's sessions."""
        session_id = session_id or self._rng.choice(self.sessions)
        return self.redis.slot_of(self.cache.group(session_id).fence)

    def _cache_migrate(self) -> bool:
        """A group's slot moved to another primary while the clients use it (ten keys per
        ``MIGRATE``, a moment between batches): misses and retried calls, never a stale
        version."""
        slot = self._cluster_slot()
        source = self.redis.owner(slot)
        target = self._rng.choice([n for n in self.redis.primaries() if n.port != source.port])
        self.redis.migrate_slot(slot, target, between=lambda: self._stop.wait(0.02))
        return True

    def _cache_shard_down(self) -> bool:
        """A primary and its replica killed, started again a moment later (empty, or from an
        older snapshot): that shard's sessions go to the database meanwhile, the others' stay
        served."""
        gone = self.redis.down(self._cluster_slot())
        self._stop.wait(PAUSE_SECONDS)
        self.redis.restart(gone)
        return True

    def _cache_restart(self) -> bool:
        """Redis restarted from a snapshot older than what it acknowledged since. Besides the
        workload's keys, on a key of the fault's own: a memory served from Redis, the snapshot
        taken, the memory written again, the restart (Redis back with the entry of the version
        before) -- then recalls through the same tier, whose connections reconnect to the new
        process, must give the version written: one that trusts the server identity its
        connection learned before serves the snapshot's (a ``stale-read``). Every restart shows
        it, where the workload's reads showed it only when one fell on a key the restart undid
        before its next write."""
        store, session_id = self._own_session("restart")
        key = "k"
        written: list[Any] = []
        try:
            store.remember(session_id, key, {"restart": 1})
            try:
                self._served_from_cache(store, session_id, key)
            except Unstaged:  # the tier not serving yet (after another fault): the restart alone
                self._restart_from_older_snapshot(session_id)
                return True
            self._restart_from_older_snapshot(
                session_id,
                after_snapshot=lambda: written.append(
                    store.remember(session_id, key, {"restart": 2})
                ),
            )
            for _ in range(3):
                found = store.recall(session_id, key)
                if found is None or found.version < written[0].version:
                    self.findings.append(
                        Anomaly(
                            "stale-read",
                            session_id,
                            key,
                            f"v{written[0].version} was acknowledged after Redis' snapshot; "
                            f"Redis was restarted from that snapshot, then recall returned "
                            f"{'nothing' if found is None else f'v{found.version}'} (from "
                            f"{store.last_read_source}): the tier trusted what the new process "
                            "reloaded",
                            [],
                        )
                    )
                    break
        finally:
            store.erase_session(session_id)
        return True

    def _restart_from_older_snapshot(self, session_id: str, after_snapshot: Any = None) -> None:
        if isinstance(self.redis, ClusterGroup):  # the primary of the session's group
            self.redis.restart_from_older_snapshot(self._cluster_slot(session_id), after_snapshot)
        else:
            self.redis.restart_from_older_snapshot(after_snapshot)

    def _cache_failover(self) -> bool:
        if isinstance(self.redis, ClusterGroup):
            killed, _ = self.redis.fail_over(self._cluster_slot())
            self.redis.rejoin(killed)
            return True
        self.redis.fail_over()
        self.redis.rejoin()
        return True

    def _redis_clock(self) -> bool:
        """Redis' clock steps back (an NTP step, a VM resumed, a replica promoted whose clock was
        behind): an entry outlives its memory by :data:`CLOCK_STEP_SECONDS`. On a key of the
        fault's own: a memory with a TTL of :data:`CLOCK_TTL_SECONDS`, served from Redis, its
        entry stretched (``PEXPIRE``); once the memory has expired -- by the store's clock --
        while Redis still holds its entry, a recall must return nothing: the version is an
        ``expired-read`` anomaly. A hit's own check of the memory's expiry is all that keeps it
        from being served. The run's memories that expire are stretched too, for the final
        reads."""
        store, session_id = self._own_session("clock")
        key = "k"
        entry = self.cache.entry_key(session_id, key)
        step_ms = int(CLOCK_STEP_SECONDS * 1000)
        try:
            self._stretch(
                [
                    self.cache.entry_key(s, k)
                    for s, k in Memory.objects.using(self.database)
                    .filter(session_id__in=self.sessions, expires_at__isnull=False)
                    .values_list("session_id", "key")
                ],
                step_ms,
            )
            written = store.remember(session_id, key, {"clock": 1}, ttl=CLOCK_TTL_SECONDS)
            self._served_from_cache(store, session_id, key)
            self._stretch([entry], step_ms)
            assert written.expires_at is not None
            # Wait for the event: the memory's expiry passing on the store's clock.
            while (left := (written.expires_at - clock.now()).total_seconds()) >= 0:
                time.sleep(left + 0.01)
            # Redis may have dropped the entry meanwhile (a renewal that distrusted the tier,
            # after a failover): the read below must find nothing all the same.
            # The first read may find the fence gone and renew it; the next ones read Redis.
            for _ in range(20):
                found = store.recall(session_id, key)
                if found is not None or store.last_read_source == "cache":
                    break
            if found is not None:
                self.findings.append(
                    Anomaly(
                        "expired-read",
                        session_id,
                        key,
                        f"v{found.version} expired at {written.expires_at.isoformat()} while "
                        f"Redis' clock was {CLOCK_STEP_SECONDS:g} s behind; then recall "
                        f"returned it (from {store.last_read_source}): a hit was trusted to "
                        "expire with its Redis entry",
                        [],
                    )
                )
        finally:
            store.erase_session(session_id)
        return True

    def _stretch(self, names: list[str], step_ms: int) -> None:
        """Every entry of ``names`` that expires lives ``step_ms`` longer (once: a stretched one
        has more than the step left)."""
        client = self.cache.client
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
        stretch = [(n, t) for n, t in zip(names, pipe.execute(), strict=True) if 0 < t < step_ms]
        pipe = client.pipeline(transaction=False)
        for name, left in stretch:
            pipe.pexpire(name, left + step_ms)
        pipe.execute()

    def _own_session(self, fault: str) -> tuple[Any, str]:
        """A store with the run's defects (a self-test variant's tier), and a session of the
        fault's own: outside the workload's, so that its checks judge only the store's calls."""
        from ..store import MemoryStore

        self._own_runs += 1
        store = MemoryStore(using=self.database, cache=self.cache.alias, defects=self.defects)
        return store, f"memcheck-{fault}-{self.sessions[0]}-{self._own_runs}"

    @staticmethod
    def _served_from_cache(store: Any, session_id: str, key: str) -> None:
        """Read ``key`` until Redis serves it (the fence is up: a renewal after a cache fault
        may first replay pending invalidations); :class:`Unstaged` if it never does."""
        for _ in range(20):
            store.recall(session_id, key)
            if store.last_read_source == "cache":
                return
        raise Unstaged("Redis never served the fault's own key (20 reads)")

    def _read_back(
        self,
        check: str,
        store: Any,
        session_id: str,
        key: str,
        version: int,
        what: str,
        why: str,
    ) -> None:
        """Read ``key`` until Redis serves it (a first read may find the fence gone and renew
        it): each read must give ``version`` or newer; the first that does not is a ``check``
        anomaly -- ``what`` happened, then the read, ``why`` it could."""
        for _ in range(20):
            found = store.recall(session_id, key)
            if found is None or found.version < version:
                read = f"v{found.version}" if found else "nothing"
                self.findings.append(
                    Anomaly(
                        check,
                        session_id,
                        key,
                        f"{what}; then recall returned {read} (from {store.last_read_source}): "
                        f"{why}",
                        [],
                    )
                )
                return
            if store.last_read_source == "cache":
                return

    def _in_thread(self, name: str, work: Any) -> tuple[threading.Thread, list[Any]]:
        """``work()`` in a thread of its own (its database connections closed after it);
        returns the thread and a list that receives what it returned or raised."""
        out: list[Any] = []

        def run() -> None:
            try:
                out.append(work())
            except Exception as exc:  # judged by the fault
                out.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread, out

    def _writer_crash(self) -> bool:
        """A writer crashes right after its COMMIT, before it updates Redis
        (:func:`~agentmemory.defects.crash_next_write`), while a reader missed on its tombstone
        and read the version before it from the database: the reader's fill lease is never
        deleted (no update comes), so only the version check of its fill keeps that older
        version out of Redis. Read again once the writer is gone, the key must give the version
        the writer committed: anything older is a ``writer-crash`` anomaly."""
        store, session_id = self._own_session("crash")
        key = "k"
        try:
            store.remember(session_id, key, {"crash": 1})
            self._served_from_cache(store, session_id, key)
            hold = defects.crash_next_write(lambda s, _keys: s == session_id, HOLD_SECONDS)
            writer, outcome = self._in_thread(
                "memcheck-crash-writer", lambda: store.remember(session_id, key, {"crash": 2})
            )
            try:
                if not hold.reached.wait(HOLD_SECONDS):
                    raise Unstaged(f"the writer did not reach its COMMIT in {HOLD_SECONDS} s")
                # The tombstone is in Redis, the COMMIT not made: a miss, read from the
                # database (the version before), filled under this reader's lease.
                store.recall(session_id, key)
            finally:
                defects.disarm(hold)
                writer.join()
            if not (outcome and isinstance(outcome[0], defects.WriterCrashed)):
                raise Unstaged(f"the write did not crash: {outcome}")
            assert hold.taken is not None
            committed = hold.taken[1][key]
            self._read_back(
                "writer-crash",
                store,
                session_id,
                key,
                committed,
                f"v{committed} committed, its writer crashed before updating Redis",
                "a fill read before the COMMIT was stored over the writer's tombstone",
            )
        finally:
            store.erase_session(session_id)
        return True

    def _cache_evict(self) -> bool:
        """Redis evicts an entry (``maxmemory``: any entry may go at any moment) between a
        write's update and a slow reader's fill (:func:`~agentmemory.defects.hold_next_fill`)
        that read the version before the write from the database: no newer version is left
        in Redis to refuse that fill, so only its lease -- which the write's update deleted --
        keeps it out. Read again, the key must give the write's version: anything older is a
        ``cache-evict`` anomaly."""
        store, session_id = self._own_session("evict")
        key = "k"
        entry = self.cache.entry_key(session_id, key)
        client = self.cache.client
        try:
            store.remember(session_id, key, {"evict": 1})
            self._served_from_cache(store, session_id, key)
            client.delete(entry)  # evicted: the next reader misses and fills
            hold = defects.hold_next_fill(lambda s, _keys: s == session_id, HOLD_SECONDS)
            reader, _ = self._in_thread(
                "memcheck-evict-reader", lambda: store.recall(session_id, key)
            )
            try:
                if not hold.reached.wait(HOLD_SECONDS):
                    raise Unstaged(f"the reader did not reach its fill in {HOLD_SECONDS} s")
                written = store.remember(session_id, key, {"evict": 2})  # acknowledged
                client.delete(entry)  # and its entry evicted, before the slow reader's fill
            finally:
                defects.disarm(hold)
                reader.join()
            self._read_back(
                "cache-evict",
                store,
                session_id,
                key,
                written.version,
                f"v{written.version} was acknowledged and its entry evicted",
                "a fill read before the write was stored",
            )
        finally:
            store.erase_session(session_id)
        return True

    def _fence_race(self) -> bool:
        """A fence renewal stalls after its check of the pending invalidations found none
        (:func:`~agentmemory.defects.hold_next_renewal`); meanwhile a writer cannot reach Redis
        (:func:`~agentmemory.defects.cut_off_next_write`), records its key as pending and waits
        out the fence before it answers; then the renewal sets the fence. A fence counted from
        the Redis clock read before the check has expired by then; one counted from the moment
        it is set has not -- and Redis still holds the version before the write. Read again,
        the key must give the written version, and again once the next renewal -- which must
        replay the pending key first -- trusts Redis: anything older is a ``fence-race``
        anomaly."""
        from ..store import MemoryStore

        reader, session_id = self._own_session("fence")
        # The writer's tier of its own: its outage is its own.
        writer = MemoryStore(using=self.database, cache=self.cache.alias, defects=self.defects)
        key = "k"
        try:
            writer.remember(session_id, key, {"fence": 1})
            self._served_from_cache(reader, session_id, key)
            self.cache.client.delete(self.cache.group(session_id).fence)  # the fence expires
            name = "memcheck-fence-reader"
            hold = defects.hold_next_renewal(
                lambda _s, _k: threading.current_thread().name == name, HOLD_SECONDS
            )

            def read_until_renewing() -> None:
                # A renewal that finds pending invalidations (a cache fault's) replays them
                # and renews on the next read.
                for _ in range(10):
                    reader.recall(session_id, key)
                    if hold.settled.is_set():
                        return

            thread, _ = self._in_thread(name, read_until_renewing)
            try:
                if not hold.reached.wait(HOLD_SECONDS):
                    raise Unstaged(f"the reader did not renew the fence in {HOLD_SECONDS} s")
                cut = defects.cut_off_next_write(lambda s, _keys: s == session_id, HOLD_SECONDS)
                written = writer.remember(session_id, key, {"fence": 2})
                if not cut.reached.is_set():
                    defects.disarm(cut)
                    raise Unstaged("the write reached Redis")
            finally:
                defects.disarm(hold)
                thread.join()
            # The first read finds no fence (it renews, after replaying what is pending), the
            # next ones read Redis.
            self._read_back(
                "fence-race",
                reader,
                session_id,
                key,
                written.version,
                f"v{written.version} was acknowledged after its writer recorded it as pending "
                "and waited out the fence, while a renewal stalled",
                "Redis was trusted with what the writer could not update",
            )
        finally:
            reader.erase_session(session_id)
        return True

    def _foreign_entry(self) -> bool:
        """Older versions of one session's memories, as another Redis server process stored
        them, put where the tier keeps those memories' entries (every key of the session that
        has an older version: what a restored snapshot does to all of them at once)."""
        from ..cache import encode_payload, stamp
        from ..models import MemoryVersion
        from ..records import MemoryRecord

        older = (
            MemoryVersion.objects.using(self.database)
            .filter(
                memory__session_id=self._rng.choice(self.sessions),
                op__in=list(VALUE_OPS),
                version__lt=F("memory__version"),
            )
            .order_by("-id")
            .values_list(
                "memory__session_id", "memory__key", "version", "value", "created_at", "expires_at"
            )[:500]
        )
        by_key: dict[tuple[str, str], list[Any]] = {}
        for row in older:
            by_key.setdefault((row[0], row[1]), []).append(row)
        if not by_key:
            return False
        client = self.cache.client
        pipe = client.pipeline(transaction=False)
        for rows in by_key.values():
            session_id, key, version, value, created, expires = self._rng.choice(rows)
            record = MemoryRecord(session_id, key, value, version, created, created, expires)
            foreign = stamp(FOREIGN_RUN_ID, self.cache.database_epoch())
            entry = f"{version}|{foreign}|{encode_payload(session_id, key, record)}"
            pipe.set(self.cache.entry_key(session_id, key), entry, px=60_000)
        pipe.execute()
        return True

    def _orm_bulk(self) -> bool:
        """What a cleanup script, a data migration or a shell does: ORM writes of memories the
        tier holds -- a queryset ``delete()``, or an ``update()`` that expires them -- on
        memories of the fault's own (a session outside the workload's, so that its checks judge
        only the store's calls), written and read through the store first (the tier holds
        them), read again right after the ORM's transaction committed. A read that returns a
        memory the ORM deleted or expired is an ``orm-bulk`` anomaly: the tier ahead of the
        database."""
        from ..store import MemoryStore

        self._orm_runs += 1
        session_id = f"memcheck-orm-{self.sessions[0]}-{self._orm_runs}"
        store = MemoryStore(using=self.database, cache=self.cache.alias)
        keys = [f"k{i}" for i in range(4)]
        try:
            for key in keys:
                store.remember(session_id, key, {"orm": self._orm_runs})
                store.recall(session_id, key)
            how = self._rng.choice(["delete", "update"])
            rows = Memory.objects.using(self.database).filter(session_id=session_id)
            with (
                defects.orm_writes_unseen() if Defect.ORM_UNSEEN in self.defects else nullcontext()
            ):
                if how == "delete":
                    rows.delete()
                else:
                    rows.update(expires_at=clock.now())
            for key in keys:
                found = store.recall(session_id, key)
                if found is not None:
                    self.findings.append(
                        Anomaly(
                            "orm-bulk",
                            session_id,
                            key,
                            f"after Memory.objects.filter(session_id=...).{how}"
                            f"({'expires_at=now' if how == 'update' else ''}) committed, recall "
                            f"returned v{found.version} (from {store.last_read_source}): the tier "
                            "kept serving what the ORM changed",
                            [],
                        )
                    )
        finally:
            store.erase_session(session_id)
        return True

    def _redis_primary(self) -> Any:
        """A connection of the nemesis's own (outside the store's pool, which it breaks) to the
        current primary of memcheck's Redis (on a cluster: of a group of the run's sessions);
        closed by :meth:`stop`."""
        if isinstance(self.redis, ClusterGroup):
            primary = self.redis.owner(self._cluster_slot())
        else:
            primary, _ = self.redis.current()
        if self._admin is None or self._admin_port != primary.port:
            if self._admin is not None:
                self._admin.close()
            self._admin, self._admin_port = primary.client(), primary.port
        return self._admin
