"""``manage.py reindex``: embed again, with the configured model, every memory another model
indexed -- in batches, in place, beside live writers."""

from __future__ import annotations

import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...errors import EmbeddingFailed, InvalidMemory, MemoryUnavailable
from ...store import MemoryStore
from ..batches import add_database_option, on_each_database, progress_bar


class Command(BaseCommand):
    help = (
        "Embed again, with AGENTMEMORY['SEARCH'] (its MODEL), every live memory whose vectors "
        "another embedding model made, from the paths it was indexed by. In place (no new "
        "version: the value does not change), one memory at a time beside live writers (a "
        "memory written meanwhile keeps its own vectors); resumable: run it again after an "
        "interruption and it goes on with what is left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument(
            "--batch",
            type=int,
            default=500,
            help="memories per batch, one embedder call each, 1 to 100000 (default: %(default)s)",
        )
        parser.add_argument("--session", default=None, help="only this session's memories")
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be embedded; change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def run(alias: str | None) -> None:
            store = MemoryStore(using=alias, cache=None)
            if store.index is None:
                raise CommandError(
                    "no semantic index is configured (AGENTMEMORY['SEARCH']): nothing to reindex",
                    returncode=2,
                )
            started = time.monotonic()
            try:
                with progress_bar(self.stderr, "reindex") as progress:
                    changed = store.reindex(
                        batch=options["batch"],
                        dry_run=options["dry_run"],
                        progress=progress,
                        session_id=options["session"],
                    )
            except (InvalidMemory, ImproperlyConfigured) as exc:
                raise CommandError(str(exc), returncode=2) from exc
            except (EmbeddingFailed, DatabaseError, MemoryUnavailable) as exc:
                raise CommandError(
                    f"reindex stopped on {store.using!r}: {exc} (what was done stays done: run it "
                    "again to go on)",
                    returncode=1,
                ) from exc
            verb = "would embed again" if options["dry_run"] else "embedded again"
            self.stdout.write(
                f"reindex on {store.using!r} with model {store.index.model_name!r}: {verb} "
                f"{changed} memories in {time.monotonic() - started:.1f} s"
            )

        on_each_database(options["database"], run, options["session"])
