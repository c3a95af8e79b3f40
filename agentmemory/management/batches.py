"""What the batch commands (``prunehistory``, ``purge_expired``, ``reindex``) share: the database alias they are
given, and the progress bar they draw on stderr."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from ..conf import get_config


def add_database_option(parser: CommandParser) -> None:
    """``--database``, as every maintenance command takes it (read back by
    :func:`checked_alias` and :func:`on_each_database`)."""
    parser.add_argument(
        "--database",
        default=None,
        help="database alias (default: AGENTMEMORY['DATABASE'], or with AGENTMEMORY['SHARDS'] "
        "each shard in turn)",
    )


def on_each_database(
    database: str | None, run: Callable[[str | None], None], session_id: str | None = None
) -> None:
    """``run(alias)`` on ``--database``; without it, on each of ``AGENTMEMORY["SHARDS"]`` in
    turn (only ``session_id``'s shard, if given) or on the default database. A shard that fails
    does not stop the others: then the command exits with the failures' highest code, naming
    each shard."""
    alias = checked_alias(database)
    shards = get_config()["SHARDS"]
    if alias is not None or not shards:
        run(alias)
        return
    if session_id is not None:
        from ..errors import InvalidMemory
        from ..sharding import place
        from ..validation import check_session_id

        try:
            session_id = check_session_id(session_id)
        except InvalidMemory as exc:
            raise CommandError(str(exc), returncode=2) from exc
        run(place(session_id, shards))
        return
    failed: list[tuple[str, CommandError]] = []
    for shard in shards:
        try:
            run(shard)
        except CommandError as exc:
            failed.append((shard, exc))
    if failed:
        raise CommandError(
            "; ".join(f"shard {shard!r}: {exc}" for shard, exc in failed),
            returncode=max(exc.returncode for _, exc in failed),
        )


def checked_alias(alias: str | None) -> str | None:
    """``--database``: None (the store's default) or an alias of ``DATABASES``; exit 2 naming
    the known ones otherwise."""
    if alias is not None and alias not in connections.settings:
        raise CommandError(
            f"unknown database alias {alias!r} (DATABASES has: {', '.join(connections)})",
            returncode=2,
        )
    return alias


@contextmanager
def progress_bar(
    stderr: Any, label: str, unit: str = "memories"
) -> Iterator[Callable[[int, int], None]]:
    """``progress(done, total)`` drawing ``label [#####.....]  50% 5/10 memories`` on the
    command's stderr: redrawn in place on a terminal, a line per batch elsewhere (a log)."""
    tty = bool(getattr(stderr._out, "isatty", lambda: False)())
    drawn = False

    def progress(done: int, total: int) -> None:
        nonlocal drawn
        share = done / total if total else 1.0
        bar = "#" * int(share * 30) + "." * (30 - int(share * 30))
        line = f"{label} [{bar}] {share:4.0%} {done}/{total} {unit}"
        stderr.write(("\r" + line) if tty else line, ending="" if tty else "\n")
        drawn = True

    try:
        yield progress
    finally:
        if tty and drawn:
            stderr.write("")
