"""``manage.py agentmemory_mcp_token``: the MCP server's bearer tokens -- create (printed once,
stored as a digest), list, revoke."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...errors import InvalidMemory
from ...models import McpToken
from ...validation import check_principal
from ..batches import add_database_option, checked_alias


class Command(BaseCommand):
    help = (
        "The MCP server's bearer tokens: 'create USER' prints a new token for principal USER as "
        "its last line (shown once: only its digest is stored); 'list [USER]' names the tokens "
        "by their first characters; 'revoke PREFIX' (or 'revoke --user USER', every token of "
        "USER) refuses them from the next request on."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser)
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="a new token for USER")
        create.add_argument("user")
        create.add_argument("--label", default="", help="what the token is for (a client, a host)")
        listing = actions.add_parser("list", help="the tokens, of USER or of everyone")
        listing.add_argument("user", nargs="?")
        revoke = actions.add_parser("revoke", help="remove tokens")
        revoke.add_argument("prefix", nargs="?", help="the token's first characters, as listed")
        revoke.add_argument("--user", help="every token of USER")

    def handle(self, *args: Any, **options: Any) -> None:
        from ...integrations.mcp import create_token

        alias = checked_alias(options["database"])
        tokens = McpToken.objects.using(alias)
        action = options["action"]
        try:
            if action == "create":
                token = create_token(options["user"], label=options["label"], using=alias)
                self.stderr.write(
                    f"a token for principal {options['user']!r} (shown once; revoke it with "
                    f"'agentmemory_mcp_token revoke {token[:12]}'):"
                )
                self.stdout.write(token)
            elif action == "list":
                if options["user"] is not None:
                    tokens = tokens.filter(principal=check_principal(options["user"]))
                rows = list(tokens.order_by("principal", "created_at"))
                for row in rows:
                    label = f"  {row.label}" if row.label else ""
                    self.stdout.write(
                        f"{row.prefix}  {row.principal}  {row.created_at:%Y-%m-%d %H:%M}{label}"
                    )
                self.stderr.write(f"{len(rows)} token(s)")
            else:
                self._revoke(tokens, options)
        except InvalidMemory as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _revoke(self, tokens: Any, options: dict[str, Any]) -> None:
        prefix, user = options["prefix"], options["user"]
        if (prefix is None) == (user is None):
            raise CommandError(
                "revoke takes a token's PREFIX or --user USER (one of them)", returncode=2
            )
        if user is not None:
            chosen = tokens.filter(principal=check_principal(user))
        else:
            if len(prefix) < 8:
                raise CommandError(
                    f"PREFIX: give at least 8 characters of the token, as listed (got {prefix!r})",
                    returncode=2,
                )
            chosen = tokens.filter(prefix__startswith=prefix)
            if chosen.count() > 1:
                raise CommandError(
                    f"PREFIX {prefix!r} names {chosen.count()} tokens: give more characters",
                    returncode=2,
                )
        deleted, _ = chosen.delete()
        if not deleted:
            raise CommandError(
                f"no token matches {prefix or user!r}; nothing revoked", returncode=1
            )
        self.stdout.write(f"revoked {deleted} token(s)")
