"""memcheck's ``db-failover`` fault: a PostgreSQL HA cluster (Patroni) on this machine loses its
primary, and an asynchronous standby is promoted without the last writes the primary
acknowledged -- the database's own loss, which memcheck must tell apart from anything the store
or its cache tier does wrong.

The alias is a multi-host one (``target_session_attrs=read-write``: it follows the primary). The
fault, on servers of this machine only:

1. stops the primary's WAL senders (``SIGSTOP``) for :data:`UNREPLICATED_SECONDS`: with
   asynchronous replication the workload's writes meanwhile are acknowledged and never reach a
   standby; with synchronous replication their COMMITs wait, unacknowledged;
2. crashes the primary as a power cut would: its Patroni and every PostgreSQL process
   ``SIGKILL``-ed at once (Patroni's own process is found by its configuration, which names the
   primary's data directory);
3. waits -- for the event -- until the alias reaches a new primary on a newer timeline (Patroni
   promotes a standby once the leader key expires: its ``ttl``);
4. starts the crashed node's Patroni again with its command line, user, directory and
   environment (Patroni rewinds it and it streams from the new primary), and waits until every
   standby streams again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connections

from .. import clock
from .nodes import LOOPBACK, NodeUnavailable, wait_gone

#: How long the primary's WAL senders stay stopped before the crash: the writes acknowledged
#: meanwhile are what an asynchronous failover loses.
UNREPLICATED_SECONDS = 0.5
#: How long a promotion, and the crashed node's return as a streaming standby, may take.
FAILOVER_TIMEOUT_SECONDS = 120.0


@dataclass
class Failover:
    """One injected failover, in the store's clock (POSIX seconds, as the history's times):
    writes acknowledged before ``crashed_at`` may be lost; the new primary answered from
    ``promoted_at`` on."""

    crashed_at: float
    promoted_at: float
    timelines: tuple[str, str]
    #: False for a failover the cluster made on its own during the run (:class:`TimelineWatch`
    #: saw its timeline move): ``crashed_at`` is then the last time the old timeline answered.
    injected: bool = True
    #: ``"restore"`` for memcheck's ``db-restore`` (a dump of its sessions put back): only writes
    #: invoked after ``lost_after`` (the dump) and before ``crashed_at`` (the restore's end) can
    #: be lost, and reads until ``promoted_at`` (the tier's documented bound) may still show them.
    #: ``"promotion"`` for a MariaDB replica promoted (:mod:`.mysql_pair`): the same, with every
    #: write invoked before ``crashed_at`` (the promotion) lost if the replica lacked it, and
    #: ``timelines`` the GTID positions of the old primary and the new.
    kind: str = "failover"
    lost_after: float = 0.0


def is_ha_alias(alias: str) -> bool:
    """A PostgreSQL alias over several hosts, all on this machine."""
    connection = connections[alias]
    hosts = str(connection.settings_dict.get("HOST") or "").split(",")
    return (
        connection.vendor == "postgresql"
        and len(hosts) > 1
        and all(host in LOOPBACK or host.startswith("/") for host in hosts)
    )


def check_local_cluster(alias: str) -> None:
    """Raises :class:`NodeUnavailable`, naming the reason, unless the alias's primary runs
    here under a Patroni this process can see."""
    if not is_ha_alias(alias):
        raise NodeUnavailable(f"{alias!r} is not a PostgreSQL alias over several local hosts")
    primary = _primary(alias)
    try:
        for pid in (primary.patroni_pid, primary.postmaster):
            os.kill(pid, 0)
    except PermissionError:
        raise NodeUnavailable(
            f"{alias!r}: this process may not signal the primary's Patroni and PostgreSQL "
            "(run memcheck as their user, or as root)"
        ) from None


def fail_over(alias: str, stop: Any = None) -> Failover | None:
    """Inject one failover on ``alias``'s cluster (the module's steps). ``stop``, an Event: set
    before the crash, nothing is crashed (None)."""
    with replication_stopped(alias) as senders:
        if stop is not None:
            if stop.wait(UNREPLICATED_SECONDS):
                return None
        else:
            time.sleep(UNREPLICATED_SECONDS)
        crashed_at = clock.now().timestamp()
        primary = crash_primary(alias)
    timeline = _wait_for(
        lambda: _newer_timeline(alias, primary.timeline), "a standby promoted on a newer timeline"
    )
    promoted_at = clock.now().timestamp()
    _restart_patroni(primary)
    _wait_for(lambda: _standbys_streaming(alias, senders), "the crashed node streaming again")
    return Failover(crashed_at, promoted_at, (primary.timeline, timeline))


#: How often :class:`TimelineWatch` asks the primary for its timeline.
WATCH_INTERVAL_SECONDS = 0.25


class TimelineWatch:
    """The primary's timeline, asked every :data:`WATCH_INTERVAL_SECONDS` for the whole run on a
    connection of its own, a new one each time: a PostgreSQL cluster can fail over without
    memcheck's fault -- its HA manager losing the leader key on a loaded machine, an operator's
    switchover, the user's real deployment failing over -- and with asynchronous replication lose
    acknowledged writes then too. Each move of the timeline that no injected failover explains is
    a :class:`Failover` (``injected=False``) the checker tells the database's losses by, and the
    report names. Not started for other vendors (no timeline to watch)."""

    def __init__(self, alias: str, injected: list[Failover]) -> None:
        self.alias = alias
        self._injected = injected
        self._moves: list[tuple[str, float, str, float]] = []  # old, last seen, new, first seen
        self._seen: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memcheck-timeline", daemon=True)

    def __enter__(self) -> TimelineWatch:
        self._look()  # the timeline the run starts on, before any worker writes
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._look()  # the timeline the run ends on

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_SECONDS):
            self._look()

    def _look(self) -> None:
        try:
            ((timeline,),) = _sql(self.alias, TIMELINE_SQL)
        except Exception:  # no primary right now (a failover under way): look again later
            return
        now = clock.now().timestamp()
        if self._seen is not None and int(timeline, 16) > int(self._seen[0], 16):
            self._moves.append((self._seen[0], self._seen[1], timeline, now))
        if self._seen is None or int(timeline, 16) >= int(self._seen[0], 16):
            self._seen = (timeline, now)

    @property
    def failovers(self) -> list[Failover]:
        """The failovers the cluster made that no injected one explains (call after stop)."""
        explained = {f.timelines for f in self._injected}
        return [
            Failover(last_seen, first_seen, (old, new), injected=False)
            for old, last_seen, new, first_seen in self._moves
            if not any(self._covers(injected, old, new) for injected in explained)
        ]

    @staticmethod
    def _covers(timelines: tuple[str, str], old: str, new: str) -> bool:
        return int(timelines[0], 16) <= int(old, 16) and int(new, 16) <= int(timelines[1], 16)


@contextlib.contextmanager
def replication_stopped(alias: str) -> Iterator[int]:
    """Inside the block the primary's WAL senders are stopped (``SIGSTOP``): its standbys
    receive nothing. Yields how many there are; resumes those still alive after it (a stopped
    sender would hold its replication slot, and every ``DROP DATABASE``, forever)."""
    senders = [pid for (pid,) in _sql(alias, "SELECT pid FROM pg_stat_replication")]
    if not senders:
        raise NodeUnavailable(f"{alias!r}: the primary has no standby streaming from it")
    for pid in senders:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield len(senders)
    finally:
        for pid in senders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def crash_primary(alias: str) -> Any:
    """Kill the alias's primary as a power cut would: its Patroni and every PostgreSQL process
    at once (``SIGKILL``: nothing is flushed or sent). Returns what it takes to start that
    Patroni again, once they are gone."""
    primary = _primary(alias)
    for pid in [primary.patroni_pid, primary.postmaster, *_children(primary.postmaster)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in (primary.patroni_pid, primary.postmaster):
        wait_gone(pid)
    return primary


# ---------------------------------------------------------------------- the processes


@dataclass
class _Primary:
    timeline: str
    data_directory: str
    postmaster: int
    patroni_pid: int
    patroni_argv: list[str]
    patroni_uid: int
    patroni_cwd: str
    patroni_env: dict[str, str]
    patroni_log: str | None


def _primary(alias: str) -> _Primary:
    ((timeline, data_directory),) = _sql(
        alias,
        "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), "
        "current_setting('data_directory')",
    )
    try:
        postmaster = int(Path(data_directory, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise NodeUnavailable(
            f"{alias!r}: the primary's postmaster is not visible ({exc})"
        ) from None
    for pid, argv in _processes():
        if "patroni" not in " ".join(argv[:2]) or not _configures(pid, argv, data_directory):
            continue
        proc = Path(f"/proc/{pid}")
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            log = os.readlink(proc / "fd" / "2")
            return _Primary(
                timeline,
                data_directory,
                postmaster,
                pid,
                argv,
                proc.stat().st_uid,
                os.readlink(proc / "cwd"),
                dict(item.decode().split("=", 1) for item in environ if b"=" in item),
                log if log.startswith("/") else None,
            )
        except OSError as exc:
            raise NodeUnavailable(f"{alias!r}: Patroni's process {pid}: {exc}") from None
    raise NodeUnavailable(
        f"{alias!r}: no Patroni process of this machine manages {data_directory} (the fault "
        "crashes the primary under Patroni, which promotes a standby)"
    )


def _configures(pid: int, argv: list[str], data_directory: str) -> bool:
    """Whether this Patroni process manages that data directory (its YAML or its environment
    names it)."""
    for arg in argv[1:]:
        if arg.endswith((".yml", ".yaml")):
            path = Path(arg) if arg.startswith("/") else Path(f"/proc/{pid}/cwd") / arg
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    name, _, value = line.strip().partition(":")
                    if name == "data_dir" and value.strip().strip("'\"") == data_directory:
                        return True
    with contextlib.suppress(OSError):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return f"PATRONI_POSTGRESQL_DATA_DIR={data_directory}".encode() in environ
    return False


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
                found.append((int(entry.name), argv))
    return found


def _children(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    children.append(int(entry.name))
    return children


def _restart_patroni(primary: _Primary) -> None:
    log = open(primary.patroni_log, "ab") if primary.patroni_log else subprocess.DEVNULL  # noqa: SIM115
    try:
        subprocess.Popen(
            primary.patroni_argv,
            cwd=primary.patroni_cwd,
            env=primary.patroni_env,
            user=primary.patroni_uid,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives memcheck, like the process it replaces
        )
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


# ---------------------------------------------------------------------- the cluster's state


def _sql(alias: str, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the alias's primary over a connection of its own (the workload's are
    broken by the fault)."""
    with _connect(alias) as link:
        return list(link.execute(sql).fetchall())


def _connect(alias: str) -> Any:
    """A psycopg connection of its own to the alias's primary, in autocommit."""
    import psycopg

    settings = connections[alias].settings_dict
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    params["connect_timeout"] = 2
    params["autocommit"] = True
    params["dbname"] = settings["NAME"]
    return psycopg.connect(**params)


TIMELINE_SQL = "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"


def _newer_timeline(alias: str, old: str) -> str | None:
    try:
        ((timeline,),) = _sql(alias, TIMELINE_SQL)
    except (DatabaseError, Exception):  # no primary yet: psycopg's OperationalError
        return None
    return timeline if int(timeline, 16) > int(old, 16) else None


def _standbys_streaming(alias: str, count: int) -> bool:
    try:
        rows = _sql(alias, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
    except Exception:  # the primary is restarting: not yet
        return False
    return rows[0][0] >= count


def _wait_for(event: Any, what: str) -> Any:
    deadline = time.monotonic() + FAILOVER_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = event()
        if found:
            return found
        time.sleep(0.1)
    raise NodeUnavailable(f"the cluster did not report {what} within {FAILOVER_TIMEOUT_SECONDS} s")
