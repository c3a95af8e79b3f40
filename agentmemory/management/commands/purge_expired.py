"""``manage.py purge_expired``: expire the memories and logs whose TTL has passed, in batches,
beside live writers -- what a scheduler runs (docs: Scheduling maintenance)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...errors import InvalidMemory, MemoryUnavailable
from ...store import MemoryStore
from ...validation import BATCH_MAX, check_version
from ..batches import add_database_option, on_each_database, progress_bar


class Command(BaseCommand):
    help = (
        "Expire what is past its TTL: each memory gets an 'expire' version (its history kept, "
        "its live row retired) and each log an 'expire' event (its items hidden). A memory or "
        "log written again with a new TTL since the batch was read is left alone. One at a "
        "time under its row lock: safe beside live writers, and resumable. Exit 0 when done, "
        "2 when it could not run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument(
            "--batch",
            type=int,
            default=1000,
            help="memories or logs read per batch, 1 to 100000 (default: %(default)s)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what is past its TTL; change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def run(alias: str | None) -> None:
            store = MemoryStore(using=alias)
            started = time.monotonic()
            try:
                batch = check_version("batch", options["batch"], minimum=1, maximum=BATCH_MAX)
                if options["dry_run"]:
                    memories, logs = store.expired_counts()
                    self.stdout.write(
                        f"purge_expired on {store.using!r}: would expire {memories} memories and "
                        f"{logs} logs (dry run: nothing changed)"
                    )
                    return
                with progress_bar(self.stderr, "purge_expired", "memories and logs") as progress:
                    expired = store.purge_expired(batch=batch, progress=progress)
            except InvalidMemory as exc:
                raise CommandError(str(exc), returncode=2) from exc
            except (DatabaseError, MemoryUnavailable) as exc:
                raise CommandError(
                    f"purge_expired could not run on {store.using!r}: {exc}", returncode=2
                ) from exc
            self.stdout.write(
                f"purge_expired on {store.using!r}: expired {expired} memories and logs "
                f"in {time.monotonic() - started:.1f} s"
            )

        on_each_database(options["database"], run)
