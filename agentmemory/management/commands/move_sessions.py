"""``manage.py move_sessions``: sessions moved between shards online (:mod:`agentmemory.moves`)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...errors import AgentMemoryError, InvalidMemory
from ...moves import away_from_home, resume_moves, sessions_on
from ...sharding import ShardedStore


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise CommandError(f"move_sessions: --fraction must be a number in (0, 1], got {text!r}")
    return value


def _spread(session_id: str) -> bytes:
    """The order in which ``--fraction`` picks sessions: a hash, so the pick is spread evenly."""
    return hashlib.blake2b(session_id.encode(), digest_size=8, person=b"agentmemory-mov").digest()


class Command(BaseCommand):
    help = (
        "Move sessions to another shard of AGENTMEMORY['SHARDS'], online: each is read "
        "throughout, and its writes wait only while its rows are copied (docs/scaling.md). "
        "'--to ALIAS SESSION_ID...' moves those sessions; '--from ALIAS --fraction F --to ALIAS' "
        "moves that fraction of the sessions stored on one shard (a new shard's share); "
        "'--rebalance' moves every session that lives away from its home shard home (after a "
        "shard was added: `agentmemory_shards set` forwarded them); '--resume' finishes the "
        "moves a mover left unfinished. Exit 2 when it could not run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("sessions", nargs="*", metavar="SESSION_ID")
        parser.add_argument("--to", dest="target", metavar="ALIAS")
        parser.add_argument("--from", dest="source", metavar="ALIAS")
        parser.add_argument("--fraction", type=_fraction)
        parser.add_argument("--resume", action="store_true")
        parser.add_argument("--rebalance", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            store = ShardedStore()
        except ImproperlyConfigured as exc:
            raise CommandError(f"move_sessions: {exc}", returncode=2) from exc
        sessions, target, source = options["sessions"], options["target"], options["source"]
        fraction = options["fraction"]
        if options["resume"]:
            if sessions or target or source or fraction:
                raise CommandError("move_sessions: --resume takes no other argument")
            done = self._run(lambda: resume_moves(store, report=self.stdout.write))
            self.stdout.write(f"{done} unfinished move(s) finished")
            return
        if options["rebalance"]:
            if sessions or target or source or fraction:
                raise CommandError("move_sessions: --rebalance takes no other argument")
            self._move(
                store, [(s, store.place(s)) for s in self._run(lambda: away_from_home(store))]
            )
            return
        if target is None:
            raise CommandError("move_sessions: --to ALIAS names the shard to move to")
        if target not in store.stores:
            raise CommandError(
                f"move_sessions: --to {target!r} is not a shard ({', '.join(store.shards)})"
            )
        if source is not None or fraction is not None:
            if sessions or source is None or fraction is None:
                raise CommandError(
                    "move_sessions: --from ALIAS and --fraction F go together, without session ids"
                )
            if source not in store.stores:
                raise CommandError(
                    f"move_sessions: --from {source!r} is not a shard ({', '.join(store.shards)})"
                )
            if source == target:
                raise CommandError("move_sessions: --from and --to name the same shard")
            found = self._run(lambda: sessions_on(source))
            sessions = sorted(found, key=_spread)[: math.ceil(len(found) * fraction)]
        elif not sessions:
            raise CommandError("move_sessions: name the sessions to move (or --from/--fraction)")
        self._move(store, [(session_id, target) for session_id in sessions])

    def _move(self, store: ShardedStore, moves: list[tuple[str, str]]) -> None:
        """Each (session, shard) moved, a line each, then what was copied in all."""
        rows = 0
        for number, (session_id, target) in enumerate(moves, 1):
            report = self._run(
                lambda session_id=session_id, target=target: store.move(session_id, target)
            )
            rows += report.rows
            if report.source == report.target:
                what = f"already on {target!r}"
            else:
                what = (
                    f"{report.source!r} -> {report.target!r}, {report.rows} rows in "
                    f"{report.seconds * 1000:.0f} ms"
                )
            self.stdout.write(f"[{number}/{len(moves)}] {session_id!r}: {what}")
        shards = sorted({target for _session, target in moves})
        self.stdout.write(
            f"{len(moves)} session(s) moved to {', '.join(map(repr, shards)) or 'no shard'}, "
            f"{rows} rows copied"
        )

    def _run(self, work: Any) -> Any:
        try:
            return work()
        except InvalidMemory as exc:
            raise CommandError(f"move_sessions: {exc}") from exc
        except AgentMemoryError as exc:
            raise CommandError(f"move_sessions: {exc}", returncode=2) from exc
