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
import time
from pathlib import Path
from typing import Any

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
READY_TIMEOUT_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.replica_of = replica_of
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",  # snapshots only when asked (save())
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Until the server answers and has loaded its data set."""
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited: see {self.directory}")
            try:
                if not self.client().info("persistence")["loading"]:
                    return
            except redis.RedisError:
                pass
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

    def stop(self) -> None:
        self.kill()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SentinelGroup:
    """A primary, a replica and three sentinels (quorum 2), on free loopback ports."""

    NAME = "agentmemory"

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.primary = RedisServer(self.directory / "primary")
        self.replica = RedisServer(self.directory / "replica", replica_of=self.primary.port)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.start()
        for index, port in enumerate(self.sentinel_ports):
            folder = self.directory / f"sentinel{index}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {self.NAME} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.NAME} 1000\n"
                f"sentinel failover-timeout {self.NAME} 10000\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    [REDIS_SERVER, str(config), "--sentinel", "--logfile", str(folder / "log")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        self.wait_until(lambda: self._replica_in_sync() and self._sentinels_see_each_other())
        return self

    def sentinel_client(self, index: int = 0) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], socket_timeout=5)

    def primary_port(self) -> int:
        _host, port = self.sentinel_client().sentinel_get_master_addr_by_name(self.NAME)
        return int(port)

    def _replica_in_sync(self) -> bool:
        info = self.primary.client().info("replication")
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return bool(replicas) and all(
            r.get("state") == "online" and r.get("offset") == info["master_repl_offset"]
            for r in replicas
        )

    def _sentinels_see_each_other(self) -> bool:
        try:
            return all(
                len(self.sentinel_client(i).sentinel_sentinels(self.NAME)) == 2
                and len(self.sentinel_client(i).sentinel_slaves(self.NAME)) == 1
                for i in range(3)
            )
        except Exception:
            return False

    def wait_until(self, condition: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except Exception:
                pass
            time.sleep(0.05)
        raise TimeoutError(
            f"sentinel group under {self.directory}: condition not met in {timeout} s"
        )

    def fail_over(self) -> None:
        """``kill -9`` the primary right now, then wait until the sentinels have promoted the
        replica and it answers as a primary."""
        self.primary.kill()
        self.wait_until(
            lambda: (
                self.primary_port() == self.replica.port
                and self.replica.client().execute_command("ROLE")[0] == b"master"
            ),
            timeout=60,
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
