"""``manage.py forgetcache``: the Redis tier forgets everything it holds of a database -- the
one line to run after the database was changed behind the store (a restore, a point-in-time
recovery, raw SQL, a promoted asynchronous replica)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...cache import MemoryCache
from ...conf import get_config
from ..batches import add_database_option, checked_alias


class Command(BaseCommand):
    help = (
        "Make the Redis cache tier forget everything it holds of a database: its fence first (no "
        "reader trusts what is left), then every entry and fill lease. Readers miss and refill "
        "from the database. Run it after the database was changed without the store: a restore, "
        "a point-in-time recovery, raw SQL, a promoted asynchronous replica. Exit 2 when there is "
        "no tier or Redis cannot be reached."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        config = get_config()
        using = checked_alias(options["database"]) or config["DATABASE"]
        alias = config["CACHE"]
        if alias is None:
            raise CommandError(
                "there is no cache tier to forget (AGENTMEMORY['CACHE'] is None)", returncode=2
            )
        try:
            deleted = MemoryCache(alias, using).forget_everything()
        except Exception as exc:  # the client's error, whatever it is: one line, exit 2
            raise CommandError(
                f"cache {alias!r} could not forget database {using!r}: {type(exc).__name__}: {exc}",
                returncode=2,
            ) from exc
        self.stdout.write(
            f"cache {alias!r}: forgot database {using!r} ({deleted} Redis names deleted); "
            "readers refill from the database"
        )
