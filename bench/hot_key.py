"""8 threads x 200 `remember` calls on one hot key: acknowledged writes, final version, errors that
reached callers, and the retries the store absorbed. Run once per backend:

    DATABASE_URL=mysql://root@127.0.0.1:3306/agentmemory .venv/bin/python bench/hot_key.py
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from agentmemory import MemoryStore  # noqa: E402

THREADS, WRITES = int(os.environ.get("THREADS", 8)), int(os.environ.get("WRITES", 200))


def main() -> None:
    call_command("migrate", verbosity=0)
    store = MemoryStore(cache=None)
    session = f"bench-hotkey-{uuid.uuid4().hex[:8]}"
    acknowledged, errors = [], []
    barrier = threading.Barrier(THREADS)

    def writer(worker: int) -> None:
        barrier.wait()
        try:
            for i in range(WRITES):
                try:
                    acknowledged.append(
                        store.remember(session, "hot", {"w": worker, "i": i}).version
                    )
                except Exception as exc:  # counted: the figure that must be 0
                    errors.append(repr(exc))
        finally:
            connections.close_all()

    started = time.perf_counter()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    history = store.history(session, "hot")
    gap_free = [h.version for h in history] == list(range(1, len(history) + 1))
    print(
        f"{connection.display_name}: {THREADS} threads x {WRITES} writes on one key: "
        f"acknowledged {len(acknowledged)}, distinct versions {len(set(acknowledged))}, "
        f"final version {store.recall(session, 'hot').version}, history gap-free {gap_free}, "
        f"caller errors {len(errors)}, retries inside the store {dict(store.retries) or 0}, "
        f"{len(acknowledged) / seconds:.0f} writes/s"
    )
    store.erase_session(session)


if __name__ == "__main__":
    main()
