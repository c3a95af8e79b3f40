"""What the admin's pages share: the store they read through, and the read-only admin of the rows
an agent's calls alone change (logs, checkpoint chains)."""

from __future__ import annotations

import functools
from functools import lru_cache
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import TO_FIELD_VAR
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import URLPattern

from .conf import get_config
from .store import MemoryStore


def admin_store() -> MemoryStore:
    """The store the admin reads and writes through: one per configured database and cache
    (a new one per request would reset the cache tier's outage state and script cache)."""
    config = get_config()
    return _store_for(config["DATABASE"], config["CACHE"])


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

    def lookup_allowed(self, lookup: str, value: Any, request: Any = None) -> bool:
        return lookup in self.filter_parameters()

    def filter_parameters(self) -> set[str]:
        """The query-string parameters this admin's ``list_filter`` reads."""
        found: set[str] = set()
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
        return super().get_queryset(request).using(admin_store().using)
