"""The server processes behind a cluster's aliases, for memcheck's node faults: find a node's
``mariadbd`` on this machine, kill it (``SIGKILL``) and start it again with the same command
line, or pause it (``SIGSTOP``/``SIGCONT``); then wait -- for the event, not for a time -- until
the node reports itself ``Synced`` again.

Only nodes whose server runs on this machine (a loopback host, a pid file this process can read,
``/proc/<pid>/cmdline``) can be faulted; anything else is refused with the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

from ..vendors import is_galera

LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1"})
#: How long a restarted or resumed node may take to be Synced again (state transfer included).
SYNC_TIMEOUT_SECONDS = 180.0


class NodeUnavailable(Exception):
    """This alias's server cannot be faulted from here (the reason is the message)."""


@dataclass
class LocalNode:
    alias: str
    pid: int
    argv: list[str]


def local_node(alias: str) -> LocalNode:
    """The Galera node behind ``alias``, if its server process runs on this machine."""
    connection = connections[alias]
    host = str(connection.settings_dict.get("HOST") or "")
    if host not in LOOPBACK:
        raise NodeUnavailable(f"{alias!r} is on {host!r}: node faults run only on this machine")
    if connection.vendor != "mysql" or not is_galera(connection):
        raise NodeUnavailable(f"{alias!r} is not a MariaDB Galera node")
    try:
        pid_file = _pid_file(connection)
    except DatabaseError:
        # This connection died with an earlier fault, or the node is still joining after one
        # ("WSREP has not yet prepared node for application use"): once it is Synced, a fresh try.
        connection.close()
        wait_synced(alias)
        pid_file = _pid_file(connection)
    try:
        with open(pid_file, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [part.decode() for part in handle.read().split(b"\0") if part]
    except (OSError, ValueError) as exc:
        raise NodeUnavailable(
            f"{alias!r}: its server process is not visible from here ({exc})"
        ) from None
    return LocalNode(alias, pid, argv)


def _pid_file(connection: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@pid_file")
        return str(cursor.fetchone()[0])


def kill_and_restart(node: LocalNode, *, timeout: float = SYNC_TIMEOUT_SECONDS) -> None:
    """``kill -9`` the node's server, start it again with the same command line, and return
    once it is Synced."""
    os.kill(node.pid, signal.SIGKILL)
    wait_gone(node.pid)
    # A restarted node joins the cluster it left: never bootstrap a new one beside it.
    argv = [arg for arg in node.argv if arg not in ("--wsrep-new-cluster", "--wsrep_new_cluster")]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives memcheck, like the server it replaces
    )
    node.pid = process.pid
    wait_synced(node.alias, timeout=timeout)


def pause(node: LocalNode, seconds: float, stop: Any = None) -> None:
    """``SIGSTOP`` the node's server for ``seconds`` (``stop``, an Event, ends it early), then
    ``SIGCONT`` it and return once it is Synced."""
    os.kill(node.pid, signal.SIGSTOP)
    try:
        if stop is not None:
            stop.wait(seconds)
        else:
            time.sleep(seconds)
    finally:
        os.kill(node.pid, signal.SIGCONT)
    wait_synced(node.alias)


def node_status(alias: str) -> dict[str, str]:
    """The node's Galera status, over a connection of its own (the workload's may be broken):
    its state, whether it is ready, the size, configuration id and last committed seqno of the
    cluster it sees."""
    import MySQLdb

    settings = connections[alias].settings_dict
    link = MySQLdb.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 3306),
        user=settings["USER"],
        passwd=settings["PASSWORD"],
        connect_timeout=2,
    )
    try:
        cursor = link.cursor()
        cursor.execute(
            "SHOW STATUS WHERE Variable_name IN ('wsrep_local_state_comment', 'wsrep_ready', "
            "'wsrep_cluster_size', 'wsrep_cluster_conf_id', 'wsrep_last_committed')"
        )
        return {name: str(value) for name, value in cursor.fetchall()}
    finally:
        link.close()


def _synced(status: dict[str, str], size: int | None) -> bool:
    return (
        status.get("wsrep_local_state_comment") == "Synced"
        and status.get("wsrep_ready") == "ON"
        and (size is None or status.get("wsrep_cluster_size") == str(size))
    )


def wait_synced(alias: str, *, timeout: float = SYNC_TIMEOUT_SECONDS) -> None:
    """Poll the node until it reports ``Synced`` and ready (a cluster of every node:
    :func:`wait_cluster_synced`)."""
    import MySQLdb

    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status = node_status(alias)
            last = (
                f"{status.get('wsrep_local_state_comment')}, ready={status.get('wsrep_ready')}, "
                f"size={status.get('wsrep_cluster_size')}"
            )
            if _synced(status, None):
                return
        except MySQLdb.Error as exc:
            last = str(exc)
        time.sleep(0.25)
    raise NodeUnavailable(f"{alias!r} was not Synced again within {timeout:.0f} s ({last})")


def wait_cluster_synced(aliases: list[str], *, timeout: float = SYNC_TIMEOUT_SECONDS) -> None:
    """Until every node is Synced in one cluster of all of them: the same configuration id
    everywhere, and each has committed what the first had when the wait began. A node just
    resumed from ``SIGSTOP`` still reports the Synced state and the view it had before its
    pause, until the others evict it and it rejoins as a joiner: asked one at a time, every
    node looked Synced, and the next fault killed another node while that one was rejoining
    -- the cluster lost its quorum (a CI rehearsal). A stale node has not committed what the
    others committed during its pause."""
    import MySQLdb

    deadline = time.monotonic() + timeout
    target: int | None = None
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            statuses = [node_status(alias) for alias in aliases]
        except MySQLdb.Error as exc:
            last = str(exc)
            time.sleep(0.25)
            continue
        if target is None:
            target = int(statuses[0].get("wsrep_last_committed") or 0)
        last = "; ".join(
            f"{alias}: {s.get('wsrep_local_state_comment')}, size={s.get('wsrep_cluster_size')}, "
            f"conf={s.get('wsrep_cluster_conf_id')}, seqno={s.get('wsrep_last_committed')}"
            for alias, s in zip(aliases, statuses, strict=True)
        )
        if (
            all(_synced(s, len(aliases)) for s in statuses)
            and len({s.get("wsrep_cluster_conf_id") for s in statuses}) == 1
            and all(int(s.get("wsrep_last_committed") or 0) >= target for s in statuses)
        ):
            return
        time.sleep(0.25)
    raise NodeUnavailable(f"the cluster was not Synced again within {timeout:.0f} s ({last})")


@contextmanager
def client_timeouts(aliases: Iterable[str], seconds: int) -> Iterator[None]:
    """Connections opened meanwhile on these aliases give up on a server that stops answering
    after ``seconds`` (connect, read, write) instead of waiting for it forever."""
    saved = {}
    for alias in aliases:
        options = connections[alias].settings_dict.setdefault("OPTIONS", {})
        saved[alias] = dict(options)
        options.update(connect_timeout=seconds, read_timeout=seconds, write_timeout=seconds)
    try:
        yield
    finally:
        for alias, options in saved.items():
            connections[alias].settings_dict["OPTIONS"] = options


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return  # a zombie: dead, waiting for a parent that may never reap it
        except (ProcessLookupError, FileNotFoundError):
            return
        # A killed child of ours stays a zombie until reaped; not ours: it goes on its own.
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    raise NodeUnavailable(f"process {pid} did not exit after SIGKILL")
