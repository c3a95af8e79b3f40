"""``manage.py prunehistory``: apply the history retention policy, in batches, beside live
writers."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...conf import get_config
from ...errors import InvalidMemory, MemoryUnavailable
from ...store import MemoryStore
from ..batches import add_database_option, checked_alias, on_each_database, progress_bar


class Command(BaseCommand):
    help = (
        "Remove old history versions: keep the newest --keep-last versions of each memory and/or "
        "those younger than --keep-days days (default: AGENTMEMORY['HISTORY_RETENTION']). The "
        "newest version is always kept; version numbers never restart. One memory at a time "
        "under its row lock: safe beside live writers, and resumable."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument(
            "--keep-last",
            type=int,
            default=None,
            metavar="N",
            help="keep the newest N versions of each memory (N >= 1)",
        )
        parser.add_argument(
            "--keep-days",
            type=float,
            default=None,
            metavar="D",
            help="keep the versions younger than D days (with --keep-last: a version either "
            "keeps is kept)",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=1000,
            help="memories per batch, 1 to 100000 (default: %(default)s)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go; change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checked_alias(options["database"])
        policy = get_config()["HISTORY_RETENTION"]
        if (
            options["keep_last"] is None
            and options["keep_days"] is None
            and policy["KEEP_LAST"] is None
            and policy["KEEP_DAYS"] is None
        ):
            self.stdout.write(
                "prunehistory: no retention policy is set (--keep-last, --keep-days, or "
                "AGENTMEMORY['HISTORY_RETENTION']): every version is kept, nothing to do"
            )
            return

        def run(alias: str | None) -> None:
            store = MemoryStore(using=alias, cache=None)
            started = time.monotonic()
            try:
                with progress_bar(self.stderr, "prunehistory") as progress:
                    pruned = store.prune_history(
                        keep_last=options["keep_last"],
                        keep_days=options["keep_days"],
                        batch=options["batch"],
                        dry_run=options["dry_run"],
                        progress=progress,
                    )
            except InvalidMemory as exc:
                raise CommandError(str(exc), returncode=2) from exc
            except (DatabaseError, MemoryUnavailable) as exc:
                raise CommandError(
                    f"prunehistory could not run on {store.using!r}: {exc}", returncode=2
                ) from exc
            verb = "would remove" if options["dry_run"] else "removed"
            self.stdout.write(
                f"prunehistory on {store.using!r}: {verb} {pruned} versions "
                f"in {time.monotonic() - started:.1f} s"
            )

        on_each_database(options["database"], run)
