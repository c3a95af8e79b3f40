"""The admin of LangGraph checkpoint chains (:mod:`agentmemory.checkpoints`), read-only: the
changelist of chains (a thread and a namespace each), and per chain a page of its checkpoints
newest first -- each with its parent, its metadata's source, step and run, and how many pending
writes it has -- and the pending writes of one checkpoint, each a keyset page of 50, so a chain
of any length opens as fast as a short one. Registered by :mod:`agentmemory.admin`."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .admin_base import ReadOnlyAdmin, page_number
from .errors import InvalidMemory
from .models import Checkpoint, CheckpointThread, CheckpointWrite
from .validation import check_name
from .vendors import prefix_filter

#: Checkpoints, and pending writes, on one page of a chain.
CHECKPOINT_PAGE = 50
#: The longest page bound taken from a query string (an id; a longer one shows the newest page).
BOUND_MAX = 255


@admin.register(CheckpointThread)
class CheckpointThreadAdmin(ReadOnlyAdmin):
    """Checkpoint chains, read-only. What changes one is LangGraph's calls (put, put_writes,
    delete_thread, prune): the admin shows, it does not edit."""

    change_form_template = "admin/agentmemory/checkpointthread/change_form.html"
    list_display = ["thread", "namespace", "version", "updated_at"]
    list_display_links = ["thread", "namespace"]
    search_fields = ["thread_id"]
    search_help_text = (
        "A thread id ('abc*' for ids starting with abc; '\"an id\"' in quotes for exactly that id)."
    )
    ordering = ["thread_id", "checkpoint_ns"]  # along the unique index
    show_full_result_count = False
    list_per_page = 50
    fields = ["thread_id", "checkpoint_ns", "version", "created_at", "updated_at"]
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        from django.db import connections

        term = search_term.strip()
        if len(search_term) >= 2 and search_term.startswith('"') and search_term.endswith('"'):
            return queryset.filter(thread_id=search_term[1:-1]), False
        if not term:
            return queryset, False
        if term.endswith("*"):
            return queryset.filter(
                prefix_filter(connections[queryset.db], "thread_id", term[:-1])
            ), False
        return queryset.filter(Q(thread_id=search_term) | Q(thread_id=term)), False

    @admin.display(description="thread id", ordering="thread_id")
    def thread(self, chain: CheckpointThread) -> SafeString:
        return format_html("<bdi>{}</bdi>", chain.thread_id)

    @admin.display(description="namespace", ordering="checkpoint_ns")
    def namespace(self, chain: CheckpointThread) -> SafeString:
        return format_html("<bdi>{}</bdi>", chain.checkpoint_ns or "(root)")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        chain = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if chain is not None:
            before = _bound(request, "before")
            checkpoints, older = chain_checkpoints(chain, before)
            shown = _bound(request, "writes_of") or (
                checkpoints[0]["checkpoint_id"] if checkpoints else None
            )
            writes_after = page_number(request, "writes_after")
            writes, more = checkpoint_writes(chain, shown, writes_after) if shown else ([], None)
            context.update(
                checkpoints=checkpoints,
                older_checkpoints=older,
                newest_page=before is None,
                writes_of=shown,
                writes=writes,
                more_writes=more,
                page_size=CHECKPOINT_PAGE,
            )
        return super().change_view(request, object_id, form_url, context)


def _bound(request: HttpRequest, name: str) -> str | None:
    """A checkpoint id from the query string (the rules of a stored one), else None: a bad one
    shows the newest page."""
    raw = request.GET.get(name, "")
    try:
        return check_name(name, raw, BOUND_MAX)
    except InvalidMemory:
        return None


def chain_checkpoints(
    chain: CheckpointThread, before: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the chain's checkpoints, newest first (below id ``before``), each with its
    metadata's source, step and run id (where LangGraph's serializer can read it) and its
    number of pending writes; and the bound of the next older page (None: this is the oldest)."""
    db = chain._state.db
    rows = Checkpoint.objects.using(db).filter(thread=chain)
    if before is not None:
        rows = rows.filter(checkpoint_id__lt=before)
    page = list(
        rows.order_by("-checkpoint_id").values(
            "checkpoint_id",
            "parent_checkpoint_id",
            "metadata_type",
            "metadata",
            "run_id",
            "created_at",
        )[: CHECKPOINT_PAGE + 1]
    )
    older = page[CHECKPOINT_PAGE - 1]["checkpoint_id"] if len(page) > CHECKPOINT_PAGE else None
    page = page[:CHECKPOINT_PAGE]
    counts = dict(
        CheckpointWrite.objects.using(db)
        .filter(thread=chain, checkpoint_id__in=[row["checkpoint_id"] for row in page])
        .values_list("checkpoint_id")
        .annotate(n=Count("id"))
    )
    for row in page:
        metadata = _decoded(row.pop("metadata_type"), bytes(row.pop("metadata")))
        row["source"] = metadata.get("source", "") if metadata else ""
        row["step"] = metadata.get("step", "") if metadata else ""
        row["writes"] = counts.get(row["checkpoint_id"], 0)
    return page, older


def checkpoint_writes(
    chain: CheckpointThread, checkpoint_id: str, after: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """A page of the pending writes of one checkpoint in the order they were saved, each with
    its value's type and size (values are the serializer's bytes: not shown); and the bound of
    the next page (None: the last)."""
    rows = CheckpointWrite.objects.using(chain._state.db).filter(
        thread=chain, checkpoint_id=checkpoint_id
    )
    if after is not None:
        rows = rows.filter(id__gt=after)
    page = list(
        rows.order_by("id").values("id", "task_id", "task_path", "idx", "channel", "type", "blob")[
            : CHECKPOINT_PAGE + 1
        ]
    )
    more = page[CHECKPOINT_PAGE - 1]["id"] if len(page) > CHECKPOINT_PAGE else None
    page = page[:CHECKPOINT_PAGE]
    for row in page:
        row["size"] = len(bytes(row.pop("blob")))
    return page, more


def _decoded(kind: str, data: bytes) -> dict[str, Any] | None:
    """Metadata as LangGraph's default serializer wrote it, or None (another serializer's, an
    encrypted one, LangGraph not installed)."""
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        decoded = JsonPlusSerializer().loads_typed((kind, data))
    except Exception:
        return None
    return decoded if isinstance(decoded, dict) else None
