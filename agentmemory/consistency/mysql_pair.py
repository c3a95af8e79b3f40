"""A MariaDB primary and its asynchronous GTID replica on this machine, behind a router -- the
most common MySQL-family high availability (a replica promoted by orchestrator, MaxScale, a
virtual IP or by hand) -- and memcheck's ``db-failover`` fault on it.

Unlike a PostgreSQL failover, a promoted MySQL replica moves no timeline: the database's epoch
stays ``0``, and what the old primary acknowledged and the replica never received is gone without
a trace the store could see at connect. The cache tier sees it at its next fence renewal (the
incarnation counter, or an entry the database no longer backs), within two fence periods.

The pair (``python -m agentmemory.consistency.mysql_pair start|stop|url``, data under
``$MARIADB_PAIR_DIR``, default ``/tmp/agentmemory-mariadb-pair``): nodes ``a`` and ``b`` on
127.0.0.1:3321 and :3322 (binary logs, GTIDs, ``log_slave_updates``: either one can serve the
other its whole history), and a router on 127.0.0.1:3320 that sends each new connection to the
node named in ``DIR/primary`` -- what applications connect to. The router's command line names
the directory: :func:`pair_of` finds a pair from an alias's port, as the PostgreSQL fault finds
Patroni.

The fault, on servers of this machine only:

1. stops the replica's I/O thread for :data:`UNREPLICATED_SECONDS`: the workload's writes
   meanwhile are acknowledged by the primary and never reach the replica;
2. ``SIGKILL``-s the primary (a power cut);
3. promotes the replica once it applied what it received (``RESET SLAVE ALL``, writable) and
   points the router at it;
4. rebuilds the crashed node as the new primary's replica (a new data directory, loaded from a
   dump of the new primary at a known GTID position: the old one holds writes nobody else has)
   and waits until it caught up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connections

from .. import clock
from .nodes import LOOPBACK, NodeUnavailable, wait_gone

DEFAULT_DIR = "/tmp/agentmemory-mariadb-pair"
PORTS = {"a": 3321, "b": 3322}
ROUTER_PORT = 3320
RUN_AS = "mysql"
#: How long the replica receives nothing before the primary crashes: the writes acknowledged
#: meanwhile are what the promotion loses.
UNREPLICATED_SECONDS = 0.5
#: How long a promotion, and the crashed node's return as a replica, may take.
FAILOVER_TIMEOUT_SECONDS = 120.0
ROUTER_MODULE = "agentmemory.consistency.mysql_pair"


@dataclass(frozen=True)
class Pair:
    """A pair's directory; which node is the primary is in ``DIR/primary``."""

    directory: Path

    def node(self, name: str) -> Path:
        return self.directory / name

    @property
    def primary(self) -> str:
        return (self.directory / "primary").read_text().strip()

    @property
    def replica(self) -> str:
        return "b" if self.primary == "a" else "a"

    def route_to(self, name: str) -> None:
        staged = self.directory / "primary.new"
        staged.write_text(name)
        staged.replace(self.directory / "primary")


# ------------------------------------------------------------------------------- the servers
def _config(pair: Pair, name: str, server_id: int) -> str:
    home = pair.node(name)
    return f"""[mysqld]
user={RUN_AS}
datadir={home}/data
socket={home}/mysqld.sock
pid-file={home}/mysqld.pid
log-error={home}/error.log
port={PORTS[name]}
bind-address=127.0.0.1
server_id={server_id}
log_bin={home}/data/binlog
log_slave_updates=ON
binlog_format=ROW
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
innodb_buffer_pool_size=64M
innodb_flush_log_at_trx_commit=1
sync_binlog=1
max_connections=300
skip_name_resolve=ON
"""


def _init_node(pair: Pair, name: str) -> None:
    """A new, empty data directory for ``name`` (whatever it held is gone)."""
    home = pair.node(name)
    home.mkdir(parents=True, exist_ok=True)
    (home / "my.cnf").write_text(_config(pair, name, _new_server_id(pair)))
    shutil.rmtree(home / "data", ignore_errors=True)
    (home / "data").mkdir()
    shutil.chown(home, RUN_AS, RUN_AS)
    shutil.chown(home / "data", RUN_AS, RUN_AS)
    done = subprocess.run(
        [
            "mariadb-install-db",
            f"--defaults-file={home}/my.cnf",
            f"--user={RUN_AS}",
            "--auth-root-authentication-method=normal",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise NodeUnavailable(f"node {name}: mariadb-install-db failed: {done.stderr[-500:]}")


def _new_server_id(pair: Pair) -> int:
    """A server id no node of the pair had: a replica skips the events of its own id (MariaDB's
    loop protection), so a node rebuilt with its old id would skip its own old writes when it
    replays the new primary's log."""
    counter = pair.directory / "server_ids"
    try:
        used = int(counter.read_text())
    except (OSError, ValueError):
        used = 0
    counter.write_text(str(used + 1))
    return used + 1


def _start_node(pair: Pair, name: str) -> None:
    home = pair.node(name)
    with open(home / "stdout.log", "ab") as log:
        subprocess.Popen(
            ["/usr/sbin/mariadbd", f"--defaults-file={home}/my.cnf"],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    _wait_for(lambda: _answers(pair, name), f"node {name} accepting connections")


def _pid(pair: Pair, name: str) -> int | None:
    try:
        pid = int((pair.node(name) / "mysqld.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _sql(pair: Pair, name: str, statement: str) -> list[tuple[Any, ...]]:
    """``statement`` (several, separated by ``;``) on node ``name`` over its socket, as root."""
    import MySQLdb

    link = MySQLdb.connect(
        unix_socket=str(pair.node(name) / "mysqld.sock"), user="root", connect_timeout=2
    )
    try:
        cursor = link.cursor()
        rows: list[tuple[Any, ...]] = []
        for one in filter(None, (s.strip() for s in statement.split(";"))):
            cursor.execute(one)
            rows = list(cursor.fetchall() or [])
        return rows
    finally:
        link.close()


def _answers(pair: Pair, name: str) -> bool:
    try:
        _sql(pair, name, "SELECT 1")
    except Exception:  # not up yet: MySQLdb's OperationalError
        return False
    return True


def _follow(pair: Pair, replica: str, primary: str) -> None:
    """``replica`` replicates from ``primary`` by GTID, read-only."""
    _sql(
        pair,
        replica,
        "SET GLOBAL read_only = 1; STOP SLAVE; RESET SLAVE ALL; "
        f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {PORTS[primary]}, "
        "MASTER_USER = 'root', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1; "
        "START SLAVE",
    )


def _caught_up(pair: Pair, replica: str, primary: str) -> bool:
    """The replica runs both threads and has applied all the primary has logged."""
    try:
        ((position,),) = _sql(pair, primary, "SELECT @@gtid_binlog_pos")
        ((applied,),) = _sql(pair, replica, "SELECT @@gtid_slave_pos")
    except Exception:  # a node restarting: not yet
        return False
    return _status(pair, replica).get("Slave_SQL_Running") == "Yes" and applied == position


def _status(pair: Pair, name: str) -> dict[str, Any]:
    import MySQLdb
    import MySQLdb.cursors

    link = MySQLdb.connect(
        unix_socket=str(pair.node(name) / "mysqld.sock"),
        user="root",
        connect_timeout=2,
        cursorclass=MySQLdb.cursors.DictCursor,
    )
    try:
        cursor = link.cursor()
        cursor.execute("SHOW SLAVE STATUS")
        return dict(cursor.fetchone() or {})
    finally:
        link.close()


def start(directory: str = DEFAULT_DIR) -> Pair:
    """Start what is not running: a pair wholly down is created afresh (it holds test data)."""
    pair = Pair(Path(directory))
    pair.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(pair.directory, 0o755)
    if not any(_pid(pair, name) for name in PORTS):
        (pair.directory / "server_ids").unlink(missing_ok=True)
        for name in PORTS:
            _init_node(pair, name)
        pair.route_to("a")
    for name in PORTS:
        if _pid(pair, name) is None:
            if not (pair.node(name) / "data" / "mysql").is_dir():
                _init_node(pair, name)
            _start_node(pair, name)
    primary, replica = pair.primary, pair.replica
    # root over TCP from 127.0.0.1 with no password, as on the single server (test data only);
    # binary-logged, so that a node rebuilt from the other's log has it too.
    _sql(
        pair,
        primary,
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
        "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; "
        "CREATE DATABASE IF NOT EXISTS agentmemory CHARACTER SET utf8mb4",
    )
    if _status(pair, replica).get("Slave_IO_Running") != "Yes":
        _follow(pair, replica, primary)
    _wait_for(lambda: _caught_up(pair, replica, primary), f"node {replica} caught up")
    if _router_pid(pair) is None:
        with open(pair.directory / "router.log", "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", ROUTER_MODULE, "router", "--dir", str(pair.directory)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        _wait_for(lambda: _port_open(ROUTER_PORT), "the router listening")
    return pair


def stop(directory: str = DEFAULT_DIR) -> None:
    pair = Pair(Path(directory))
    pids = [p for p in (_router_pid(pair), *(_pid(pair, n) for n in PORTS)) if p]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in pids:
        wait_gone(pid, timeout=60)


def url() -> str:
    return f"mysql://root@127.0.0.1:{ROUTER_PORT}/agentmemory"


# ------------------------------------------------------------------------------- the router
def route(directory: str, port: int = ROUTER_PORT) -> None:
    """Serve forever: each connection to ``port`` goes to the node ``DIR/primary`` names when it
    arrives (a connection to a crashed primary ends with it)."""
    pair = Pair(Path(directory))
    listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(("127.0.0.1", PORTS[pair.primary]), timeout=2)
        except OSError:
            client.close()  # the primary is down: refused, as a dead virtual IP would be
            continue
        server.settimeout(None)
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _router_pid(pair: Pair) -> int | None:
    for pid, argv in _processes():
        if ROUTER_MODULE in argv and "router" in argv and str(pair.directory) in argv:
            return pid
    return None


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            found.append((int(entry.name), argv))
    return found


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


# ------------------------------------------------------------------------------- the fault
def pair_of(alias: str) -> Pair | None:
    """The pair whose router the alias connects to, if it is one on this machine."""
    connection = connections[alias]
    if connection.vendor != "mysql":
        return None
    if str(connection.settings_dict.get("HOST") or "") not in LOOPBACK:
        return None
    port = str(connection.settings_dict.get("PORT") or "")
    if port != str(ROUTER_PORT):
        return None
    for _, argv in _processes():
        if ROUTER_MODULE in argv and "router" in argv and "--dir" in argv:
            return Pair(Path(argv[argv.index("--dir") + 1]))
    return None


@contextlib.contextmanager
def replication_stopped(pair: Pair) -> Iterator[str]:
    """Inside the block the replica receives nothing (its I/O thread stopped); yields the
    primary's name. Started again after it, if the replica is still a replica."""
    replica = pair.replica
    _sql(pair, replica, "STOP SLAVE IO_THREAD")
    try:
        yield pair.primary
    finally:
        if pair.replica == replica:
            _sql(pair, replica, "START SLAVE IO_THREAD")


def crash_and_promote(pair: Pair) -> tuple[float, float, tuple[str, str]]:
    """Kill the primary (``SIGKILL``), promote the replica once it applied what it received,
    point the router at it. Returns when the primary crashed, when the new one was promoted,
    and the GTID positions of the old primary just before the crash and of the new one."""
    primary, replica = pair.primary, pair.replica
    ((logged,),) = _sql(pair, primary, "SELECT @@gtid_binlog_pos")
    pid = _pid(pair, primary)
    if pid is None:
        raise NodeUnavailable(f"node {primary}: no server process")
    crashed_at = clock.now().timestamp()
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    received = _status(pair, replica).get("Gtid_IO_Pos") or ""
    if received:
        _sql(pair, replica, f"SELECT MASTER_GTID_WAIT('{received}', 60)")
    _sql(pair, replica, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
    ((promoted,),) = _sql(pair, replica, "SELECT @@gtid_binlog_pos")
    pair.route_to(replica)
    return crashed_at, clock.now().timestamp(), (logged, promoted)


def rejoin(pair: Pair) -> None:
    """Rebuild the node that is not the primary as its replica, from nothing (it may hold writes
    the primary never had), and wait until it caught up."""
    primary, replica = pair.primary, pair.replica
    pid = _pid(pair, replica)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
    _init_node(pair, replica)
    _start_node(pair, replica)
    _sql(
        pair,
        replica,
        "SET sql_log_bin = 0; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
        "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
    )
    _copy(pair, primary, replica)
    _follow(pair, replica, primary)
    _wait_for(lambda: _caught_up(pair, replica, primary), f"node {replica} caught up")


SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def _copy(pair: Pair, source: str, target: str) -> None:
    """The source's databases into the target, with the GTID position they were dumped at as
    the target's replication position (``mariadb-dump --gtid --master-data``, one consistent
    snapshot): the target replicates from there on, instead of replaying the source's whole
    binary log (minutes, after a few memcheck runs)."""
    databases = [d for (d,) in _sql(pair, source, "SHOW DATABASES") if d not in SYSTEM_DATABASES]
    if not databases:
        return
    dump = subprocess.Popen(
        [
            "mariadb-dump",
            "--no-defaults",
            f"--socket={pair.node(source) / 'mysqld.sock'}",
            "--user=root",
            "--single-transaction",
            "--gtid",
            "--master-data=1",
            "--databases",
            *databases,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    load = subprocess.run(
        [
            "mariadb",
            "--no-defaults",
            f"--socket={pair.node(target) / 'mysqld.sock'}",
            "--user=root",
            "--init-command=SET sql_log_bin = 0",
        ],
        stdin=dump.stdout,
        capture_output=True,
        check=False,
    )
    assert dump.stdout is not None and dump.stderr is not None
    dump.stdout.close()
    failed = dump.wait()
    if failed or load.returncode:
        raise NodeUnavailable(
            f"node {target}: copying node {source}'s databases failed: "
            f"{dump.stderr.read().decode(errors='replace')[-300:]}"
            f"{load.stderr.decode(errors='replace')[-300:]}"
        )


def caught_up(pair: Pair) -> bool:
    """The replica has applied everything the primary logged."""
    return _caught_up(pair, pair.replica, pair.primary)


def fail_over(pair: Pair, stop: Any = None) -> tuple[float, float, tuple[str, str]] | None:
    """Inject one failover (the module's steps): what :func:`crash_and_promote` returns, or None
    if ``stop`` (an Event) was set before the crash."""
    with replication_stopped(pair):
        if stop is not None:
            if stop.wait(UNREPLICATED_SECONDS):
                return None
        else:
            time.sleep(UNREPLICATED_SECONDS)
        done = crash_and_promote(pair)
    rejoin(pair)
    return done


def _wait_for(event: Any, what: str) -> Any:
    deadline = time.monotonic() + FAILOVER_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = event()
        if found:
            return found
        time.sleep(0.1)
    raise NodeUnavailable(f"the MariaDB pair did not report {what} in {FAILOVER_TIMEOUT_SECONDS} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {ROUTER_MODULE}", allow_abbrev=False)
    parser.add_argument("action", choices=["start", "stop", "url", "router"])
    parser.add_argument("--dir", default=os.environ.get("MARIADB_PAIR_DIR", DEFAULT_DIR))
    args = parser.parse_args(argv)
    if args.action == "router":
        route(args.dir)
    elif args.action == "url":
        print(url())
    elif args.action == "stop":
        stop(args.dir)
        print("mariadb-pair: stopped", file=sys.stderr)
    else:
        pair = start(args.dir)
        print(
            f"mariadb-pair: ready: primary {pair.primary} (127.0.0.1:{PORTS[pair.primary]}), "
            f"replica {pair.replica}, router 127.0.0.1:{ROUTER_PORT}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
