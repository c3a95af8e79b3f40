"""What the admin's pages share: the store they read through, and the read-only admin of the rows
an agent's calls alone change (logs, checkpoint chains)."""

from __future__ import annotations

import functools
from functools import lru_cache
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.options import TO_FIELD_VAR
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.urls import URLPattern

from .conf import get_config
from .store import MemoryStore

#: The query-string parameter that names the shard a page shows (``AGENTMEMORY["SHARDS"]``).
SHARD_VAR = "shard"


def admin_shards() -> list[str]:
    """The shards the admin offers (sorted), or [] without ``AGENTMEMORY["SHARDS"]``."""
    return sorted(get_config()["SHARDS"] or ())


def admin_database(request: HttpRequest | None = None) -> str:
    """The database a page shows: ``AGENTMEMORY["DATABASE"]``; with ``SHARDS`` set, the shard
    the request names (``?shard=ALIAS``, which Django's preserved filters carry from a list to a
    row's page and back), else the first shard. A name that is no shard shows the first."""
    shards = admin_shards()
    if not shards:
        return str(get_config()["DATABASE"])
    if request is not None:
        name = request.GET.get(SHARD_VAR)
        if name is None:
            name = QueryDict(request.GET.get("_changelist_filters", "")).get(SHARD_VAR)
        if name in shards:
            return str(name)
    return shards[0]


def shard_query(request: HttpRequest) -> str:
    """``?shard=ALIAS`` for the links and redirects of a row's page on a shard, else ``""``."""
    if not admin_shards():
        return ""
    return "?" + urlencode({SHARD_VAR: admin_database(request)})


def admin_store(request: HttpRequest | None = None, database: str | None = None) -> MemoryStore:
    """The store the admin reads and writes through -- of ``database`` (a row's own), else of
    the database the request's page shows (:func:`admin_database`): one per database and cache
    (a new one per request would reset the cache tier's outage state and script cache)."""
    return _store_for(database or admin_database(request), get_config()["CACHE"])


class ShardFilter(admin.SimpleListFilter):
    """The list's shard (``AGENTMEMORY["SHARDS"]``): one database at a time, the first by
    default; no "All" (a list is one query, on one database)."""

    title = "shard"
    parameter_name = SHARD_VAR

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(alias, alias) for alias in admin_shards()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset  # the admin's get_queryset already reads the shard's database

    def choices(self, changelist: Any) -> Any:
        shards = admin_shards()
        value = self.value()
        shown = value if value in shards else shards[0]
        for alias, title in self.lookup_choices:
            yield {
                "selected": alias == shown,
                "query_string": changelist.get_query_string({SHARD_VAR: alias}),
                "display": title,
            }


@lru_cache(maxsize=8)
def _store_for(database: str, cache: str | None) -> MemoryStore:
    return MemoryStore(using=database, cache=cache)


def page_number(request: HttpRequest, name: str) -> int | None:
    """A keyset page's bound from the query string -- ASCII digits, from 1 to 2**63 - 1 --
    else None: a bad one shows the newest page, never an error (``str.isdigit`` takes ``"²"``,
    which ``int`` refuses: a server error)."""
    raw = request.GET.get(name, "")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        return None
    number = int(raw)
    return number if 0 < number < 2**63 else None


def _no_nul(view: Any) -> Any:
    """``view``, answering 400 to a request with a NUL in a parameter's name or value (no page
    of these models needs one, and PostgreSQL refuses it in any query: a server error) or an
    empty ``_to_field``."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        for params in (request.GET, request.POST):
            for name, values in params.lists():
                if "\x00" in name or any("\x00" in value for value in values):
                    return HttpResponseBadRequest(f"NUL in the parameter {name!r}")
        if request.GET.get(TO_FIELD_VAR, None) == "":
            # Django's change form takes "" for a field's name (FieldDoesNotExist: a 500).
            return HttpResponseBadRequest(f"an empty {TO_FIELD_VAR}")
        return view(request, *args, **kwargs)

    return guarded


class GuardedAdmin(admin.ModelAdmin):
    """The pages of agentmemory's models answer bad parameters with a 400 or a page, never a
    server error: a NUL anywhere is refused, and a changelist filters by its own filters'
    parameters only (Django's admin also takes any lookup of a model's own fields from the
    query string: ``?session_id__regex=[`` or ``?expires_at__year=99999`` reached the database
    and failed there)."""

    def get_urls(self) -> list[Any]:
        return [
            URLPattern(url.pattern, _no_nul(url.callback), url.default_args, url.name)
            if isinstance(url, URLPattern)
            else url
            for url in super().get_urls()
        ]

    #: Whether the model's rows are sharded (with the sessions): its pages then show one
    #: shard at a time (:class:`ShardFilter`).
    sharded = True

    def get_list_filter(self, request: HttpRequest) -> Any:
        found = list(super().get_list_filter(request))
        return [ShardFilter, *found] if self.sharded and admin_shards() else found

    def lookup_allowed(self, lookup: str, value: Any, request: Any = None) -> bool:
        return lookup in self.filter_parameters()

    def filter_parameters(self) -> set[str]:
        """The query-string parameters this admin's ``list_filter`` reads."""
        found: set[str] = {SHARD_VAR} if self.sharded and admin_shards() else set()
        for entry in self.list_filter:
            if isinstance(entry, tuple):
                field, kind = entry
                if issubclass(kind, admin.DateFieldListFilter):
                    found |= {f"{field}__gte", f"{field}__lt", f"{field}__isnull"}
                else:
                    found |= {field, f"{field}__exact", f"{field}__isnull"}
            elif isinstance(entry, str):
                found |= {entry, f"{entry}__exact", f"{entry}__isnull"}
            else:
                found.add(entry.parameter_name)
        return found


class ReadOnlyAdmin(GuardedAdmin):
    """An admin that shows and never edits: what changes these rows is the agent's calls (a
    log's append, pop, clear; a checkpointer's put, delete_thread, prune); the view permission
    is enough to read them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        database = admin_database(request) if self.sharded else get_config()["DATABASE"]
        return super().get_queryset(request).using(database)
