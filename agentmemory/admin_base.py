"""What the admin's pages share: the store they read through, and the read-only admin of the rows
an agent's calls alone change (logs, checkpoint chains)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

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


class ReadOnlyAdmin(admin.ModelAdmin):
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
