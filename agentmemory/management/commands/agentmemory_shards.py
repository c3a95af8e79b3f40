"""``manage.py agentmemory_shards``: the list of shards each shard records
(:mod:`agentmemory.sharding`), and changing it."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...conf import get_config
from ...sharding import check_shards, record_shards, recorded_shards


class Command(BaseCommand):
    help = (
        "Each shard of AGENTMEMORY['SHARDS'] records the list of shards its sessions are placed "
        "over; a process with another list is refused. 'show' prints each shard's list (exit 1 "
        "if one differs from the setting); 'set' records the setting's list on every shard "
        "before any process serves with it, and forwards each session whose home the list "
        "changed to the shard it lives on (docs/scaling.md). Exit 2 when it could not run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["show", "set"])

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            shards = check_shards(get_config()["SHARDS"])
        except ImproperlyConfigured as exc:
            raise CommandError(f"agentmemory_shards: {exc}", returncode=2) from exc
        configured = sorted(shards)
        differs = False
        for alias in configured:
            try:
                if options["action"] == "set":
                    record_shards(alias, configured)
                found = recorded_shards(alias)
            except DatabaseError as exc:
                raise CommandError(
                    f"agentmemory_shards could not read shard {alias!r}: {exc}", returncode=2
                ) from exc
            if found is None:
                state = "none recorded (the first ShardedStore call records the setting's)"
            elif found == configured:
                state = ", ".join(found)
            else:
                differs = True
                state = f"{', '.join(found)}  <- not the setting's ({', '.join(configured)})"
            self.stdout.write(f"{alias}: {state}")
        if options["action"] == "set" and len(configured) > 1:
            self._forward(configured)
        if differs:
            raise SystemExit(1)

    def _forward(self, shards: list[str]) -> None:
        """After a list is recorded: each session whose home it changed forwarded from there to
        where it lives (agentmemory.moves.forward_to_homes), so that none reads as empty."""
        from ...errors import AgentMemoryError
        from ...moves import forward_to_homes
        from ...sharding import ShardedStore

        try:
            done = forward_to_homes(ShardedStore(shards, cache=None))
        except (AgentMemoryError, DatabaseError) as exc:
            raise CommandError(
                f"agentmemory_shards set recorded the list, but could not forward the sessions "
                f"whose home changed: {exc} -- run it again before serving with the list",
                returncode=2,
            ) from exc
        for session_id, home, alias in done.forwarded:
            self.stdout.write(f"forwarded {session_id!r}: home {home!r}, lives on {alias!r}")
        self.stdout.write(
            f"{len(done.forwarded)} session(s) forwarded from a new home to where they live "
            f"({done.already} already were); `move_sessions --rebalance` brings them home"
        )
        for session_id, home, alias in done.conflicts:
            self.stderr.write(
                f"not forwarded: {session_id!r} lives on {alias!r} and its home {home!r} holds "
                "rows of it too (two copies of one session): look before moving either"
            )
        if done.conflicts:
            raise SystemExit(1)
