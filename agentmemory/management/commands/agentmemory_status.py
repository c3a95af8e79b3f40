"""``manage.py agentmemory_status``: is the memory ready to serve -- the database reachable and
migrated, the Redis tier reachable and trusted, no invalidation pending -- for an operator, a
readiness probe, a deploy script."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import get_config
from ...health import status
from ..batches import add_database_option, checked_alias


class Command(BaseCommand):
    help = (
        "Whether the memory can serve: the database reachable and every agentmemory migration "
        "applied; the Redis tier (if configured) reachable, its fence up and no invalidation "
        "pending. Exit 0 ready, 1 degraded (the tier unreachable or distrusted: recalls are "
        "served by the database), 2 down (the database unreachable or not migrated)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument("--format", choices=("text", "json"), default="text")

    def handle(self, *args: Any, **options: Any) -> None:
        using = checked_alias(options["database"]) or get_config()["DATABASE"]
        report = status(using)
        if options["format"] == "json":
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for check in report["checks"]:
                self.stdout.write(f"{check['check']:<24}{check['state']:<10}{check['detail']}")
            self.stdout.write(f"agentmemory on {using!r}: {report['state']}")
        if report["code"]:
            # The report is the output; the exit code says the rest.
            raise CommandError(f"agentmemory is {report['state']}", returncode=report["code"])
