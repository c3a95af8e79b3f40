"""Redis servers of one's own, on free loopback ports: for the tests that restart, crash or fail
over a Redis (and never a Redis anybody else uses). Each waits for the event it needs -- the
server answering and done loading, a replica in sync, a sentinel naming the new primary -- never
for a fixed time.

    with RedisServer(tmp_path / "r", appendonly=True) as server:
        server.url                      # redis://127.0.0.1:<port>/0
        server.kill(); server.start()   # kill -9, then start again from what it persisted
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
READY_TIMEOUT_SECONDS = 30.0
#: A restart from an older snapshot (:meth:`SentinelGroup.restart_from_older_snapshot`): how many
#: keys the primary changes after its snapshot before it crashes, and the longest it waits for
#: them (an idle server crashes without them).
WRITES_AFTER_SNAPSHOT = 200
AFTER_SNAPSHOT_SECONDS = 1.0
#: The longest a sentinel group waits for an event (a failover, a replica in sync). A failover
#: normally takes 2-3 s; a sentinel that saw its timer late (a loaded machine) enters TILT mode
#: and acts on nothing for 30 s, and a failed election is retried after twice the failover
#: timeout: the deadline covers one of each.
WAIT_SECONDS = 90.0
FAILOVER_TIMEOUT_MS = 5000
#: How many ports a server of ours tries when the one it chose was taken before it could bind it
#: (by another process's server, or an outgoing connection's local port).
PORT_ATTEMPTS = 5

_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_port() -> int:
    """A loopback port nothing is bound to now and that this process never handed out before:
    the kernel may give the same free port to two probes in a row, and a group's five servers
    must not be told one port twice. Another process may still take it before our server binds
    it: the servers here then start again on another (:data:`PORT_ATTEMPTS`)."""
    with _handing_out:
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port


class PortTaken(RuntimeError):
    """Our server could not bind the port chosen for it: something else has it."""


def _bind_failed(log: Path, offset: int) -> bool:
    """Whether a Redis that exited said, in its log past ``offset``, that its port was taken."""
    if not log.exists():
        return False
    with log.open("rb") as handle:
        handle.seek(offset)
        return b"Address already in use" in handle.read()


def _probe(port: int) -> Any:
    """A client that gives up at once: a port held by a socket that never answers (another
    process's) must not hold a wait past the moment our server exits."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


class RedisServer:
    """One ``redis-server`` in ``directory``: RDB snapshots on demand (``save``), or an AOF
    with ``appendfsync everysec``; optionally the replica of ``replica_of`` (a port)."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        replica_of: int | None = None,
        port: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        # A port we chose may be chosen again if it turns out taken, until the server first ran:
        # a restart must come back on the port its clients know.
        self._may_move = port is None
        self.appendonly = appendonly
        self.replica_of = replica_of
        self.extra = extra  # more redis-server arguments ("--maxmemory", "2mb", ...)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start()
            except PortTaken:
                if not self._may_move or attempt == PORT_ATTEMPTS:
                    raise
                self.port = free_port()
            else:
                self._may_move = False
                return self
        raise AssertionError("unreachable")

    def _start(self) -> None:
        log = self.directory / "redis.log"
        offset = _size(log)
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",  # snapshots only when asked (save())
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--logfile", str(log),
            # A replica's full sync starts at once: Redis' default waits 5 s for more replicas
            # to share a diskless transfer -- 5 s of every start, rejoin and restart here.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        args += self.extra
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            self.wait_ready()
        except RuntimeError:
            self.kill()
            if _bind_failed(log, offset):
                raise PortTaken(f"127.0.0.1:{self.port} is taken") from None
            raise

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Until the server answers and has loaded its data set."""
        import redis

        probe = _probe(self.port)
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited: see {self.directory}")
            if time.monotonic() >= deadline:
                break
            try:
                info = probe.info()
            except redis.RedisError:
                info = None
            if info is not None and self.process is not None:
                # Ours, not another process on a port that was free when we chose it (another
                # run's server would answer until ours found the port taken and exited).
                if info["process_id"] != self.process.pid:
                    raise PortTaken(
                        f"another Redis (pid {info['process_id']}) answers on {self.port}"
                    )
                if not info["loading"]:
                    return
            time.sleep(0.02)
        raise TimeoutError(f"redis-server on {self.port} not ready within {timeout} s")

    def save(self) -> None:
        """A snapshot now (``SAVE``): what a restart from the RDB file comes back with."""
        self.client().save()

    def kill(self) -> None:
        """``kill -9``: nothing is flushed, nothing is saved."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def pause(self) -> None:
        """``SIGSTOP``: the server holds its connections and answers nothing."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
        self.kill()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    details: Callable[[], str] | None = None,
) -> None:
    """Until ``condition()`` is true (an error from it: a server not answering yet), checked
    every 50 ms; ``TimeoutError`` naming ``what``, the last error and ``details()`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as error:
            last = error
        time.sleep(0.05)
    raise TimeoutError(
        f"{what}: condition not met in {timeout} s (last error: {last!r})"
        + (f"\n{details()}" if details is not None else "")
    )


def snapshot_then_crash(primary: RedisServer, after_snapshot: Callable[[], Any] | None) -> None:
    """``SAVE`` on ``primary``, ``after_snapshot()``, more writes (until
    :data:`WRITES_AFTER_SNAPSHOT` keys changed, or :data:`AFTER_SNAPSHOT_SECONDS` on an idle
    server), then ``kill -9``: what a restart will come back without."""
    primary.save()
    if after_snapshot is not None:
        after_snapshot()
    deadline = time.monotonic() + AFTER_SNAPSHOT_SECONDS
    while time.monotonic() < deadline:
        changes = primary.client().info("persistence")["rdb_changes_since_last_save"]
        if changes >= WRITES_AFTER_SNAPSHOT:
            break
        time.sleep(0.01)
    primary.kill()


class SentinelGroup:
    """A primary, a replica and three sentinels (quorum 2), on free loopback ports. The roles
    move with failovers: :meth:`current` asks the sentinels which is which."""

    def __init__(self, directory: Path, *, down_after_ms: int = 1000) -> None:
        self.directory = Path(directory)
        self.down_after_ms = down_after_ms
        self.primary = RedisServer(self.directory / "primary")
        self.replica = RedisServer(self.directory / "replica", replica_of=self.primary.port)
        self.sentinel_ports = [free_port() for _ in range(3)]
        # The service name: one per group, since django-redis keeps a connection pool per
        # LOCATION (redis://<name>/0) for the life of the process.
        self.NAME = f"agentmemory-{self.sentinel_ports[0]}"
        self.sentinels: list[subprocess.Popen] = []
        self._targets: dict[tuple[int, int], int] = {}

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.replica_of = self.primary.port  # the primary's port may have moved
        self.replica.start()
        for index in range(len(self.sentinel_ports)):
            self.sentinels.append(self._start_sentinel(index))
        # The sentinels find each other by their hellos (every 2 s): only a failover needs
        # that (fail_over waits for it), not the clients, which each sentinel answers at once.
        self.wait_until(lambda: self._in_sync(self.primary, self.replica))
        return self

    def _start_sentinel(self, index: int) -> subprocess.Popen:
        """Sentinel ``index``, answering on its port -- on another one if the port chosen for it
        was taken before it could bind it."""
        folder = self.directory / f"sentinel{index}"
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "log"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port, offset = self.sentinel_ports[index], _size(log)
            config = folder / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {self.NAME} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.NAME} {FAILOVER_TIMEOUT_MS}\n"
            )
            process = subprocess.Popen(
                [REDIS_SERVER, str(config), "--sentinel", "--logfile", str(log)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            answer = self._answer(index, process)
            if answer == "ours":
                return process
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            taken = answer == "another" or _bind_failed(log, offset)
            if not taken or attempt == PORT_ATTEMPTS:
                break
            self.sentinel_ports[index] = free_port()
        raise RuntimeError(f"sentinel{index} did not start: see {log}\n" + self.logs())

    def _answer(self, index: int, process: subprocess.Popen) -> str:
        """Who answers on sentinel ``index``'s port: ``"ours"`` (``process``), ``"another"``
        server that holds the port, or ``"nobody"`` (``process`` exited or never answered)."""
        import redis

        probe = _probe(self.sentinel_ports[index])
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            try:
                pid = probe.info("server")["process_id"]
            except redis.RedisError:
                pid = None
            if pid is not None:
                return "ours" if pid == process.pid else "another"
            time.sleep(0.02)
        return "nobody"

    def sentinel_client(self, index: int = 0) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], socket_timeout=5)

    def primary_port(self) -> int:
        """The primary a majority of the sentinels name (one sentinel may be down, or in its
        TILT mode, or not yet told of a failover the others agreed on)."""
        named: list[int] = []
        for index in range(len(self.sentinel_ports)):
            try:
                _host, port = self.sentinel_client(index).sentinel_get_master_addr_by_name(
                    self.NAME
                )
            except Exception:
                continue
            named.append(int(port))
        for port in set(named):
            if named.count(port) * 2 > len(self.sentinel_ports):
                return port
        raise RuntimeError(f"the sentinels do not agree on a primary: {named}")

    def current(self) -> tuple[RedisServer, RedisServer]:
        """(primary, replica) as the sentinels see them now."""
        port = self.primary_port()
        if port == self.primary.port:
            return self.primary, self.replica
        return self.replica, self.primary

    def describe(self) -> str:
        primary, replica = self.current()
        return (
            f"memcheck's own Redis: primary 127.0.0.1:{primary.port}, replica "
            f"127.0.0.1:{replica.port}, sentinels on {', '.join(map(str, self.sentinel_ports))}"
        )

    def restart_from_older_snapshot(self, after_snapshot: Callable[[], Any] | None = None) -> None:
        """The crash a snapshot does not cover: the primary takes a snapshot (``SAVE``), goes on
        acknowledging writes -- until :data:`WRITES_AFTER_SNAPSHOT` more keys changed, or
        :data:`AFTER_SNAPSHOT_SECONDS` passed on an idle server -- then is ``kill -9``-ed and
        started again from that snapshot: the same server, but a new process, back with entries
        the old process stored and older than what it acknowledged since (Redis' own ``save``
        points do the same to a server that crashes between two of them). Then wait until it is
        the primary again with its replica in sync. ``after_snapshot``: called once the snapshot
        is taken, before the writes go on (a write the restart will undo)."""
        primary, replica = self.current()
        snapshot_then_crash(primary, after_snapshot)
        primary.replica_of = None  # it comes back as the primary it was
        primary.start()
        self.wait_until(
            lambda: self.primary_port() == primary.port and self._in_sync(primary, replica)
        )

    def rejoin(self) -> None:
        """Start the server a failover left dead again, as the replica of the new primary, and
        wait until it is in sync."""
        primary, old = self.current()
        old.replica_of = primary.port
        old.start()
        self.wait_until(lambda: self._in_sync(primary, old))

    def _in_sync(self, primary: RedisServer, replica: RedisServer) -> bool:
        """The replica is online and has caught up with what the primary had written when the
        wait began (under load the primary moves on meanwhile: "equal" might never hold)."""
        info = primary.client().info("replication")
        target = self._targets.setdefault((primary.port, replica.port), info["master_repl_offset"])
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        caught_up = any(
            r.get("port") == replica.port and r.get("state") == "online" and r["offset"] >= target
            for r in replicas
        )
        if caught_up:
            self._targets.pop((primary.port, replica.port), None)
        return caught_up

    def _sentinels_see_each_other(self) -> bool:
        try:
            return all(
                len(self.sentinel_client(i).sentinel_sentinels(self.NAME)) == 2
                and len(self.sentinel_client(i).sentinel_slaves(self.NAME)) == 1
                for i in range(3)
            )
        except Exception:
            return False

    def wait_until(self, condition: Any, timeout: float = WAIT_SECONDS) -> None:
        wait_for(condition, timeout, f"sentinel group under {self.directory}", self.logs)

    def logs(self, lines: int = 15) -> str:
        """The last lines of each sentinel's log: what they saw and decided (a failover that did
        not happen says why there)."""
        parts = []
        for index in range(len(self.sentinel_ports)):
            log = self.directory / f"sentinel{index}" / "log"
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"-- sentinel{index} ({log}):\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def fail_over(self) -> None:
        """``kill -9`` the primary right now, then wait until the sentinels have promoted the
        replica and it answers as a primary."""
        self.wait_until(self._sentinels_see_each_other)  # a quorum that knows the replica
        primary, replica = self.current()
        primary.kill()
        self.wait_until(
            lambda: (
                self.primary_port() == replica.port
                and replica.client().execute_command("ROLE")[0] == b"master"
            ),
        )

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.replica.stop()
        self.primary.stop()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
#: A cluster node is judged failed after this long unreachable; its replica is then promoted
#: (about twice this, with the election).
CLUSTER_NODE_TIMEOUT_MS = 1000
SLOTS = 16384


class ClusterGroup:
    """A Redis Cluster of our own: ``primaries`` primaries, each with one replica, on free
    loopback ports (each node's cluster bus on a free port of its own, ``cluster-port``). A
    slot whose primary and replica are both down does not stop the others
    (``cluster-require-full-coverage no``): a shard down costs its own slots only.

        with ClusterGroup(tmp_path / "c") as cluster:
            cluster.url                          # redis-cluster://127.0.0.1:<port>,...
            cluster.fail_over(cluster.slot_of("key"))   # kill -9 its primary, replica promoted
            cluster.migrate_slot(slot, to=port)  # resharding, as redis-cli --cluster does it
    """

    def __init__(self, directory: Path, *, primaries: int = 3) -> None:
        self.directory = Path(directory)
        self.nodes = [
            RedisServer(self.directory / f"node{index}", extra=()) for index in range(primaries * 2)
        ]

    @property
    def url(self) -> str:
        """Every node's address (the cluster client learns the roles and slots from any one
        that answers: ``CLUSTER SLOTS``)."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> ClusterGroup:
        for node in self.nodes:
            bus = free_port()
            node.extra = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node.directory / "nodes.conf"),
                "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
                "--cluster-port", str(bus),
                "--cluster-require-full-coverage", "no",
                # A replica promotes itself however long it was cut off (its data is still
                # what the tier must survive: entries stamped by another process).
                "--cluster-replica-validity-factor", "0",
            )  # fmt: skip
            node.start()
        created = subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed:\n{created.stdout}{created.stderr}"
            )
        self.wait_until(self.healthy)
        return self

    def _info(self, node: RedisServer) -> dict[str, str]:
        text = node.client().execute_command("CLUSTER", "INFO")
        text = text.decode() if isinstance(text, bytes) else text
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def roles(self) -> dict[int, tuple[str, int | None]]:
        """Each running node's port: (its role, the port of its primary when a replica)."""
        found: dict[int, tuple[str, int | None]] = {}
        for node in self.alive():
            role = node.client().execute_command("ROLE")
            if role[0] == b"master":
                found[node.port] = ("primary", None)
            else:
                found[node.port] = ("replica", int(role[2]))
        return found

    def healthy(self) -> bool:
        """Every running node sees the cluster ok, every slot served, and every replica of a
        running primary in sync (so that a failover has a replica to promote)."""
        for node in self.alive():
            info = self._info(node)
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                return False
            replication = node.client().info("replication")
            if replication["role"] == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def slot_of(self, key: str) -> int:
        return int(self.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", key))

    def owner(self, slot: int) -> RedisServer:
        """The running primary serving ``slot``, as the running nodes see it."""
        for node in self.alive():
            for start, end, (_host, port, *_rest), *_replicas in node.client().execute_command(
                "CLUSTER", "SLOTS"
            ):
                if start <= slot <= end:
                    return self._node(int(port))
        raise LookupError(f"no running node knows slot {slot}")

    def _node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def _id(self, node: RedisServer) -> str:
        return node.client().execute_command("CLUSTER", "MYID").decode()

    def fail_over(
        self, slot: int, meanwhile: Callable[[], Any] | None = None
    ) -> tuple[RedisServer, RedisServer]:
        """``kill -9`` the primary of ``slot`` now, then wait until the cluster has promoted its
        replica and every running node sees the cluster ok. Returns (killed, promoted).
        ``meanwhile``: called with the replica paused (``SIGSTOP``) and its link closed just
        before the kill -- what it writes the primary acknowledges and the promoted replica never
        receives."""
        primary = self.owner(slot)
        replicas = [
            p for p, (role, of) in self.roles().items() if role == "replica" and of == primary.port
        ]
        if not replicas:
            raise RuntimeError(f"the primary of slot {slot} (:{primary.port}) has no replica")
        promoted = self._node(replicas[0])
        if meanwhile is not None:
            # Paused, the replica would still read what reached its socket once resumed: its
            # link is closed from the primary's side too, so nothing written after reaches it.
            promoted.pause()
            primary.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
            try:
                meanwhile()
            finally:
                primary.kill()
                promoted.resume()
        primary.kill()
        self.wait_until(
            lambda: (
                promoted.client().execute_command("ROLE")[0] == b"master"
                and all(self._info(n).get("cluster_state") == "ok" for n in self.alive())
            )
        )
        return primary, promoted

    def rejoin(self, node: RedisServer) -> None:
        """Start a killed node again (its ``nodes.conf`` kept): it rejoins as a replica of the
        primary that replaced it; waits until it is in sync."""
        node.start()
        self.wait_until(self.healthy)

    def down(self, slot: int) -> list[RedisServer]:
        """``kill -9`` the primary of ``slot`` and its replicas: a whole shard down. Waits until
        the other primaries have seen it fail (their own slots keep answering)."""
        primary = self.owner(slot)
        gone = [primary] + [
            self._node(p)
            for p, (role, of) in self.roles().items()
            if role == "replica" and of == primary.port
        ]
        for node in gone:
            node.kill()
        self.wait_until(
            lambda: all(
                b"fail" in line
                for node in self.alive()
                for line in node.client().execute_command("CLUSTER", "NODES").splitlines()
                if f":{primary.port}@".encode() in line
            )
        )
        return gone

    def migrate_slot(
        self, slot: int, to: RedisServer, between: Callable[[], Any] | None = None
    ) -> None:
        """Move ``slot`` to primary ``to`` while clients use it, the way ``redis-cli --cluster
        reshard`` does: IMPORTING on the target, MIGRATING on the source, its keys moved by
        ``MIGRATE`` in batches (``between()`` called after each batch: traffic mid-move), then
        the slot given to the target on every primary."""
        source = self.owner(slot)
        if source.port == to.port:
            return
        source_id, target_id = self._id(source), self._id(to)
        to.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
            if not keys:
                break
            source.client().execute_command(
                "MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys
            )
            if between is not None:
                between()
        for node in self.alive():
            if node.client().execute_command("ROLE")[0] == b"master":
                node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_until(lambda: self.owner(slot).port == to.port and self.healthy())

    def restart_from_older_snapshot(
        self, slot: int, after_snapshot: Callable[[], Any] | None = None
    ) -> None:
        """:meth:`SentinelGroup.restart_from_older_snapshot` on the primary of ``slot``: a
        snapshot, more writes, ``kill -9``, started again at once from the snapshot (a new
        process with older entries). Then wait until the cluster is ok and its replica in sync
        (had the restart outlasted the node timeout, the replica took over: as good a fault)."""
        primary = self.owner(slot)
        snapshot_then_crash(primary, after_snapshot)
        primary.start()
        self.wait_until(self.healthy)

    def restart(self, nodes: list[RedisServer]) -> None:
        """Start ``nodes`` again (a shard :meth:`down`), and wait until the cluster is ok."""
        for node in nodes:
            node.start()
        self.wait_until(self.healthy)

    def describe(self) -> str:
        roles = self.roles()
        primaries = sorted(p for p, (role, _) in roles.items() if role == "primary")
        replicas = sorted(p for p, (role, _) in roles.items() if role == "replica")
        return (
            "memcheck's own Redis Cluster: primaries "
            + ", ".join(f"127.0.0.1:{p}" for p in primaries)
            + "; replicas "
            + ", ".join(f"127.0.0.1:{p}" for p in replicas)
        )

    def primaries(self) -> list[RedisServer]:
        return [self._node(p) for p, (role, _) in self.roles().items() if role == "primary"]

    def wait_until(self, condition: Any, timeout: float = WAIT_SECONDS) -> None:
        wait_for(condition, timeout, f"Redis cluster under {self.directory}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> ClusterGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
