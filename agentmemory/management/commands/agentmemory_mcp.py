"""``manage.py agentmemory_mcp``: the MCP server (:mod:`agentmemory.integrations.mcp`) on stdio
as one principal, or on Streamable HTTP with bearer tokens."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...errors import InvalidMemory
from ...validation import check_principal
from ..batches import add_database_option, checked_alias


class Command(BaseCommand):
    help = (
        "Serve the memory to MCP clients (Claude Desktop and Code, Cursor, any MCP SDK): on "
        "stdin/stdout as --user USER, or with --http on Streamable HTTP at /mcp, each request "
        "acting as the owner of its bearer token (manage.py agentmemory_mcp_token create USER). "
        "Exit 0 when stdin closes (stdio) or on Ctrl-C (HTTP), 2 when it cannot start."
    )
    # stdout is the protocol's channel on stdio: nothing else may be written to it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        parser.add_argument("--user", help="stdio: the principal every call acts as")
        parser.add_argument(
            "--http", action="store_true", help="serve Streamable HTTP (stateless) instead"
        )
        parser.add_argument(
            "--host", default="127.0.0.1", help="HTTP: address (default: %(default)s)"
        )
        parser.add_argument(
            "--port", type=int, default=8765, help="HTTP: port (default: %(default)s)"
        )
        parser.add_argument(
            "--allowed-host",
            action="append",
            dest="allowed_hosts",
            default=None,
            help="HTTP: a Host header to accept, e.g. mcp.example.com (repeat for several; "
            "default: the loopback names on a loopback address, any host otherwise)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from ...integrations import mcp
        except ImportError as exc:
            raise CommandError(
                f'the MCP server needs the mcp package ({exc}): pip install ".[mcp]"',
                returncode=2,
            ) from exc
        from ...store import MemoryStore

        store = MemoryStore(using=checked_alias(options["database"]))
        if options["http"]:
            if options["user"] is not None:
                raise CommandError(
                    "--user is for stdio; over HTTP each request acts as its token's principal",
                    returncode=2,
                )
            self._serve_http(mcp, store, options)
            return
        if options["user"] is None:
            raise CommandError("stdio needs --user USER (or serve --http)", returncode=2)
        try:
            principal = check_principal(options["user"])
        except InvalidMemory as exc:
            raise CommandError(f"--user: {exc.message}", returncode=2) from exc
        import anyio

        anyio.run(mcp.serve_stdio, principal, store)

    def _serve_http(self, mcp: Any, store: Any, options: dict[str, Any]) -> None:
        import uvicorn

        port = options["port"]
        if not 0 <= port <= 65535:
            raise CommandError(f"--port: must be 0 to 65535, got {port}", returncode=2)
        app = mcp.http_app(store, host=options["host"], allowed_hosts=options["allowed_hosts"])
        self.stderr.write(
            f"agentmemory MCP server on http://{options['host']}:{port}/mcp "
            f"(database {store.using!r}; bearer tokens: manage.py agentmemory_mcp_token)"
        )
        uvicorn.run(app, host=options["host"], port=port, log_level="warning", lifespan="on")
