"""``manage.py repaircache``: compare every entry the Redis tier would serve of a database with
the database, and delete each one the database does not back -- what raw SQL (an ``UPDATE`` or a
``DELETE`` in a SQL shell) leaves behind, which nothing else can see. Printing what it fixed.
``memcheck --audit`` points here when it finds the tier ahead of the database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...cache import MemoryCache
from ...conf import get_config
from ..batches import add_database_option, checked_alias


class Command(BaseCommand):
    help = (
        "Compare every entry the Redis cache tier would serve of a database with the database, "
        "and delete each one the database does not back (a version it does not hold, another "
        "value, a row gone, an older version), printing each. Safe under traffic: it only "
        "deletes, and only an entry still as it was compared. Exit 0 when it finished (whatever "
        "it fixed), 2 when there is no tier or Redis or the database cannot be reached."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be deleted, delete nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = get_config()
        using = checked_alias(options["database"]) or config["DATABASE"]
        alias = config["CACHE"]
        if alias is None:
            raise CommandError(
                "there is no cache tier to repair (AGENTMEMORY['CACHE'] is None)", returncode=2
            )
        dry_run = options["dry_run"]

        def progress(done: int, _total: int) -> None:
            self.stderr.write(f"repaircache: {done} entries compared")

        try:
            compared, fixed = MemoryCache(alias, using).repair(dry_run=dry_run, progress=progress)
        except Exception as exc:  # the client's or the database's error: one line, exit 2
            raise CommandError(
                f"cache {alias!r} could not be repaired against database {using!r}: "
                f"{type(exc).__name__}: {exc}",
                returncode=2,
            ) from exc
        verb = "would delete" if dry_run else "deleted"
        for (session_id, key), why in fixed:
            self.stdout.write(f"{verb} ({session_id!r}, {key!r}): {why}")
        self.stdout.write(
            f"cache {alias!r}, database {using!r}: {compared} entries compared, {len(fixed)} "
            "not backed by the database"
            + (" (dry run: nothing deleted)" if dry_run else ", deleted")
        )
