"""Django admin for memories: inspect what an agent remembers and how it changed, and repair it --
always through the store's one write path, so every change is a new version, compare-and-set
against what the operator saw, logged (``LogEntry``) and reflected in the Redis tier. And for
logs: a log's items and events, read-only, a page at a time (keyset pages: the same cost at any
length).

Safe on big tables: the changelist never counts the whole table (an estimate from the server's
statistics, or a count capped at :data:`COUNT_CAP` when filtered), reads a preview of each value
instead of the value, and sorts along the ``(session_id, key)`` index.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast, Left
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from . import clock
from .admin_base import (
    GuardedAdmin,
    ReadOnlyAdmin,
    admin_database,
    admin_store,
    page_number,
    shard_query,
)
from .errors import InvalidMemory, VersionConflict
from .models import (
    Log,
    LogEvent,
    LogItem,
    McpToken,
    Memory,
    MemoryState,
    MemoryVersion,
    is_live,
)
from .records import VALUE_OPS
from .store import MemoryStore
from .validation import MAX_DEPTH
from .vendors import estimated_rows, prefix_filter

#: A filtered changelist counts at most this many rows ("10000+" beyond).
COUNT_CAP = 10_000
#: Versions shown on a memory's page (newest first); the rest stay reachable by search.
HISTORY_SHOWN = 50
PREVIEW_CHARS = 80
#: Most memories one bulk action changes (each is listed on its confirmation page).
BULK_MAX = 1000
#: A version pair is diffed only when both sides are at most this many lines and characters of
#: pretty JSON: a line diff is quadratic in the worst case, and no memory may make the page slow.
DIFF_MAX_LINES = 400
DIFF_MAX_CHARS = 20_000


def _pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (refused by the store): shown escaped
        return json.dumps(value, indent=2, sort_keys=True)
    return text


def status_of(memory: Memory) -> str:
    if is_live(memory.state, memory.expires_at, clock.now()):
        return "live"
    if memory.state == MemoryState.FORGOTTEN:
        return "forgotten"
    return "expired"


class EstimatedCountPaginator(Paginator):
    """No ``COUNT(*)`` over the whole table on every page load: the unfiltered count is the
    server's own estimate (PostgreSQL ``reltuples``, MySQL/MariaDB/TiDB ``TABLE_ROWS``), a
    filtered one is capped at :data:`COUNT_CAP`."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet) and not queryset.query.where:
            estimate = _estimated_rows(queryset)
            if estimate is not None and estimate > COUNT_CAP:
                return estimate
        if isinstance(queryset, QuerySet):
            return queryset.order_by()[: COUNT_CAP + 1].count()
        return len(queryset)


def _estimated_rows(queryset: QuerySet) -> int | None:
    return estimated_rows(connections[queryset.db], queryset.model._meta.db_table)


#: A search term with more slashes than this is not split at each (an id may hold slashes).
SEARCH_SPLITS_MAX = 8


def search_condition(connection: Any, term: str, key: str = "key") -> Q:
    """The changelist search: ``"exact id"`` in double quotes is that session id exactly,
    spaces, slashes and all; ``abc*`` the sessions whose id starts with ``abc``; otherwise the
    session whose id is the term, or -- for each ``/`` in it -- session ``left`` with its keys
    starting with ``right`` (``user/42/notes`` finds session ``user/42``'s ``notes...`` and
    session ``user``'s ``42/notes...``). Exact and prefix matches only: each is an index range
    on every backend, and exact whatever the collation (SQLite's LIKE ignores ASCII case, and a
    bulk action on the result would then reach other sessions). ``key``: the field after the
    slash (a log's ``stream``)."""
    if len(term) >= 2 and term.startswith('"') and term.endswith('"'):
        return Q(session_id=term[1:-1])
    term_stripped = term.strip()
    if not term_stripped:
        return Q()
    if term_stripped.endswith("*") and "/" not in term_stripped:
        return prefix_filter(connection, "session_id", term_stripped[:-1])
    condition = Q(session_id=term) | Q(session_id=term_stripped)
    slashes = [at for at, char in enumerate(term_stripped) if char == "/"][:SEARCH_SPLITS_MAX]
    for at in slashes:
        session, right = term_stripped[:at], term_stripped[at + 1 :]
        condition |= Q(session_id=session) & prefix_filter(connection, key, right)
    return condition


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "live"), ("expired", "expired"), ("forgotten", "forgotten")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = clock.now()
        if self.value() == "live":
            return queryset.live(now)
        if self.value() == "expired":
            # Expired: recorded as such, or live with a TTL that has passed (not purged yet).
            return queryset.filter(
                Q(state=MemoryState.EXPIRED) | Q(state=MemoryState.LIVE, expires_at__lte=now)
            )
        if self.value() == "forgotten":
            return queryset.filter(state=MemoryState.FORGOTTEN, version__gt=0)
        return queryset


class PrettyJSONField(forms.JSONField):
    """A JSON value, pretty-printed. Empty is not JSON (``null`` is the JSON for none); a text
    nested too deep for the parser is an error of the form, never a server error."""

    default_error_messages = {
        "empty": "Enter a JSON value (null for none): an empty value is not JSON.",
        "too_deep": f"The value nests arrays/objects deeper than the limit of {MAX_DEPTH}.",
    }

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise forms.ValidationError(self.error_messages["empty"], code="empty")
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None

    def validate(self, value: Any) -> None:
        """``null`` is a value here (emptiness is refused by :meth:`to_python`)."""

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return _pretty(value)


def expected_for(memory: Memory, loaded: int) -> int:
    """The ``expected_version`` for a change made from a page that showed version ``loaded``.
    The store compares a live memory's version; a memory that is not live compares as 0, so the
    version it has now is checked here (a write reviving it must not undo a newer forget)."""
    if memory.version != loaded:
        raise VersionConflict(memory.session_id, memory.key, expected=loaded, actual=memory.version)
    return loaded if status_of(memory) == "live" else 0


class MemoryForm(forms.ModelForm):
    """The value as pretty JSON; saving writes a new version through the store with
    compare-and-set against ``loaded_version``, so an agent's write made meanwhile is reported
    instead of overwritten. The write happens in ``clean`` so that a conflict is a form error."""

    value = PrettyJSONField(
        required=True,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 100, "class": "vLargeTextField"}),
        help_text="JSON. Saving writes a new version (the old one stays in the history below).",
    )
    loaded_version = forms.IntegerField(widget=forms.HiddenInput, min_value=0)

    class Meta:
        model = Memory
        # The model's field is not bound to the form (ModelAdmin.get_form adds Meta.exclude): the store writes
        # the value in clean, and the model's own validation (which calls null "blank") must
        # not run after that write.
        exclude = ["value"]  # noqa: DJ006 (the admin passes the fieldsets as fields)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["value"].widget.attrs["spellcheck"] = "false"
        if self.instance.pk is not None:
            self.fields["loaded_version"].initial = self.instance.version
            self.initial["value"] = self.instance.value
        self.written = None
        self.unchanged = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors or self.instance.pk is None:
            return data
        memory, loaded = self.instance, data["loaded_version"]
        # An edit keeps the memory's expiry time: the operator changes what, not how long.
        remaining = None
        if memory.expires_at is not None and memory.expires_at > clock.now():
            remaining = memory.expires_at - clock.now()
        if (
            data.get("value") == memory.value
            and memory.version == loaded
            and status_of(memory) == "live"
        ):
            self.unchanged = True  # the same value again: no new version, nothing logged
            return data
        try:
            self.written = admin_store(database=memory._state.db).remember(
                memory.session_id,
                memory.key,
                data["value"],
                ttl=remaining,
                expected_version=expected_for(memory, loaded),
            )
        except VersionConflict as conflict:
            raise forms.ValidationError(
                f"This memory changed meanwhile: you loaded version {loaded}, it is now version "
                f"{conflict.actual}. Nothing was saved; reload the page to see the current value.",
                code="version_conflict",
            ) from None
        except InvalidMemory as error:
            self.add_error("value", str(error))
        return data


@admin.register(Memory)
class MemoryAdmin(GuardedAdmin):
    form = MemoryForm
    change_form_template = "admin/agentmemory/memory/change_form.html"
    list_display = ["session", "memory_key", "version", "preview", "updated_at", "expiry"]
    list_display_links = ["session", "memory_key"]
    list_filter = [StatusFilter, ("updated_at", admin.DateFieldListFilter)]
    search_fields = ["session_id"]
    search_help_text = (
        "A session id ('abc*' for ids starting with abc; '\"an id\"' in quotes for exactly "
        "that id, spaces and slashes included); 'session/key' for that session's keys starting "
        "with key."
    )
    ordering = ["session_id", "key"]  # along the unique index: no sort of the table
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    readonly_fields = [
        "session_id",
        "key",
        "version",
        "status",
        "created_at",
        "updated_at",
        "expires_at",
    ]
    fieldsets = [
        (None, {"fields": ["session_id", "key", "version", "status"]}),
        ("Value", {"fields": ["value", "loaded_version"]}),
        ("Times", {"fields": ["created_at", "updated_at", "expires_at"]}),
    ]
    actions = ["forget_selected", "expire_selected"]

    # ---------------------------------------------------------------- permissions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # memories are written by agents, through the store

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # forget (a version) instead; deleting would erase the history

    # ---------------------------------------------------------------- changelist

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The database the store writes to (AGENTMEMORY["DATABASE"]), not the default one.
        # The vectors are never shown: never read.
        queryset = super().get_queryset(request).using(admin_database(request)).defer("embedding")
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            queryset = queryset.defer("value").annotate(
                value_preview=Left(Cast("value", TextField()), PREVIEW_CHARS + 1)
            )
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        return queryset.filter(search_condition(connections[queryset.db], search_term)), False

    # Ids are isolated from the text around them (<bdi>): a right-to-left character in one cannot
    # reorder the page. Bidirectional-text controls are refused in new ids; old rows may have them.
    @admin.display(description="session id", ordering="session_id")
    def session(self, memory: Memory) -> SafeString:
        return format_html("<bdi>{}</bdi>", memory.session_id)

    @admin.display(description="key", ordering="key")
    def memory_key(self, memory: Memory) -> SafeString:
        return format_html("<bdi>{}</bdi>", memory.key)

    @admin.display(description="value")
    def preview(self, memory: Memory) -> str:
        text = getattr(memory, "value_preview", None)
        if text is None:
            return "—" if memory.state != MemoryState.LIVE else "null"
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"

    @admin.display(description="expires", ordering="expires_at")
    def expiry(self, memory: Memory) -> SafeString:
        status = status_of(memory)
        when = memory.expires_at.strftime("%Y-%m-%d %H:%M:%S") if memory.expires_at else "never"
        colours = {"live": "#2e7d32", "expired": "#757575", "forgotten": "#b71c1c"}
        return format_html(
            '<span class="am-badge am-{}" style="color:#fff;background:{};padding:1px 6px;'
            'border-radius:8px">{}</span> {}',
            status,
            colours[status],
            status,
            when,
        )

    @admin.display(description="status")
    def status(self, memory: Memory) -> str:
        return status_of(memory)

    @admin.action(
        description="Forget selected memories (a forget version each)", permissions=["change"]
    )
    def forget_selected(self, request: HttpRequest, queryset: QuerySet) -> TemplateResponse | None:
        return self._bulk(request, queryset, "forget", MemoryStore.forget, "forgot")

    @admin.action(
        description="Expire selected memories now (an expire version each)", permissions=["change"]
    )
    def expire_selected(self, request: HttpRequest, queryset: QuerySet) -> TemplateResponse | None:
        return self._bulk(request, queryset, "expire", MemoryStore.expire, "expired")

    def _bulk(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        verb: str,
        retire: Callable[..., bool],
        done: str,
    ) -> TemplateResponse | None:
        """First a confirmation page listing each memory at the version the operator sees; then,
        once confirmed, each change with compare-and-set against that version: a memory an agent
        wrote meanwhile is left alone and reported, never changed unseen."""
        memories = list(
            queryset.only("id", "session_id", "key", "version", "state", "expires_at")[
                : BULK_MAX + 1
            ]
        )
        if len(memories) > BULK_MAX:
            self.message_user(
                request,
                f"Select at most {BULK_MAX} memories for one action (narrow the search).",
                messages.ERROR,
            )
            return None
        if request.POST.get("confirmed") != "yes":
            return TemplateResponse(
                request,
                "admin/agentmemory/memory/bulk_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": f"{verb.capitalize()} {len(memories)} memories?",
                    "opts": self.model._meta,
                    "action": request.POST.get("action", ""),
                    "verb": verb,
                    "rows": [(memory, status_of(memory)) for memory in memories],
                    "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                },
            )
        store, changed, moved = admin_store(request), 0, []
        for memory in memories:
            try:
                loaded = int(request.POST[f"loaded_version_{memory.pk}"])
                if retire(
                    store,
                    memory.session_id,
                    memory.key,
                    expected_version=expected_for(memory, loaded),
                ):
                    changed += 1
                    self.log_change(
                        request, memory, f"{done.capitalize()} (was version {memory.version})."
                    )
            except (KeyError, ValueError):
                moved.append(str(memory))  # not on the confirmation page: not confirmed
            except VersionConflict:
                moved.append(str(memory))
        self.message_user(request, f"{done.capitalize()} {changed} memories.", messages.SUCCESS)
        if moved:
            self.message_user(
                request,
                f"Left {len(moved)} unchanged: written since the confirmation page showed them "
                f"({', '.join(moved[:10])}{', ...' if len(moved) > 10 else ''}).",
                messages.WARNING,
            )
        return None

    # ---------------------------------------------------------------- change view

    def save_model(self, request: HttpRequest, obj: Memory, form: Any, change: bool) -> None:
        """The store wrote the new version during validation (``MemoryForm.clean``); the
        admin's own ``save()`` would bypass versioning, so it does nothing here."""
        obj.refresh_from_db()
        obj.saved_unchanged = form.unchanged  # type: ignore[attr-defined]

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(obj, "saved_unchanged", False):
            return None  # nothing was written: nothing to log
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        if getattr(obj, "saved_unchanged", False):
            self.message_user(
                request,
                f"Nothing was saved: the value is the same as version {obj.version}'s.",
                messages.INFO,
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().response_change(request, obj)

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        """Only the declared filters may come from the query string (``?value__contains=``
        would be a JSON lookup some backends cannot run, ``?key__regex=`` a scan): anything
        else is Django's 400, never a 500."""
        field, _, operator = lookup.partition("__")
        if field not in {f.name for f in Memory._meta.get_fields()} | {"pk"}:
            return True  # a list filter's own parameter (status), or what Django ignores
        return field == "updated_at" and operator in ("gte", "lt", "isnull", "")

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> str:
        written = getattr(form, "written", None)
        if written is None:
            return "No change."
        return (
            f"Edited the value: version {form.cleaned_data['loaded_version']} -> {written.version}."
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        memory = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if memory is not None:
            context.update(
                history=history_rows(memory),
                status=status_of(memory),
                can_act=self.has_change_permission(request, memory),
                action_urls={
                    name: reverse(f"admin:agentmemory_memory_{name}", args=[memory.pk])
                    + shard_query(request)
                    for name in ("forget", "expire", "extend", "revert")
                },
            )
        return super().change_view(request, object_id, form_url, context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        """The page's History button: the memory's own versions (its page's history panel),
        not Django's log of admin edits, which holds only what operators did here."""
        memory = self.get_object(request, object_id)
        if memory is None or not self.has_view_or_change_permission(request, memory):
            return super().history_view(request, object_id, extra_context)
        url = reverse("admin:agentmemory_memory_change", args=[memory.pk]) + shard_query(request)
        return HttpResponseRedirect(f"{url}#am-history")

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/forget/", wrap(self.forget_view), name="agentmemory_memory_forget"),
            path("<int:pk>/expire/", wrap(self.expire_view), name="agentmemory_memory_expire"),
            path("<int:pk>/extend/", wrap(self.extend_view), name="agentmemory_memory_extend"),
            path("<int:pk>/revert/", wrap(self.revert_view), name="agentmemory_memory_revert"),
            *super().get_urls(),
        ]

    def _act(self, request: HttpRequest, pk: int, act: Any) -> HttpResponse:
        """Run one change of one memory through the store, with compare-and-set against the
        version the operator's page showed; log it; say what happened."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        memory = get_object_or_404(self.get_queryset(request), pk=pk)
        if not self.has_change_permission(request, memory):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        url = reverse("admin:agentmemory_memory_change", args=[pk]) + shard_query(request)
        try:
            expected = int(request.POST["loaded_version"])
            message = act(
                admin_store(database=memory._state.db), memory, expected_for(memory, expected)
            )
        except InvalidMemory as error:  # before ValueError, which it is
            self.message_user(request, str(error), messages.ERROR)
        except (KeyError, ValueError):
            self.message_user(
                request, "The form did not say which version it showed.", messages.ERROR
            )
        except VersionConflict as conflict:
            self.message_user(
                request,
                f"This memory changed meanwhile: the page showed version {expected}, it is now "
                f"version {conflict.actual}. Nothing was changed; look again and retry.",
                messages.ERROR,
            )
        else:
            if message:
                self.log_change(request, memory, message)
                self.message_user(request, message, messages.SUCCESS)
            else:
                self.message_user(
                    request, "Nothing to do: the memory is not live.", messages.WARNING
                )
        return HttpResponseRedirect(url)

    def forget_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._retire(request, pk, MemoryStore.forget, "Forgot the memory")

    def expire_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._retire(request, pk, MemoryStore.expire, "Expired the memory now")

    def _retire(
        self, request: HttpRequest, pk: int, retire: Callable[..., bool], done: str
    ) -> HttpResponse:
        """Forget or expire: a version that retires the live memory."""

        def act(store: MemoryStore, memory: Memory, expected: int) -> str | None:
            if retire(store, memory.session_id, memory.key, expected_version=expected):
                return f"{done} (version {memory.version} -> {memory.version + 1})."
            return None

        return self._act(request, pk, act)

    def extend_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        def act(store: MemoryStore, memory: Memory, expected: int) -> str | None:
            try:
                hours = float(request.POST.get("hours", ""))
            except ValueError:
                hours = 0.0
            if not 0 < hours < 1e6:
                raise InvalidMemory("ttl", "give the new time to live in hours, e.g. 24")
            if status_of(memory) != "live":
                return None
            record = store.remember(
                memory.session_id,
                memory.key,
                memory.value,
                ttl=timedelta(hours=hours),
                expected_version=expected,
            )
            return (
                f"Set the memory to expire in {hours:g} h (version {expected} -> {record.version})."
            )

        return self._act(request, pk, act)

    def revert_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        def act(store: MemoryStore, memory: Memory, expected: int) -> str:
            try:
                target = int(request.POST["version"])
            except (KeyError, ValueError):
                raise InvalidMemory("version", "say which version to revert to") from None
            record = store.revert(memory.session_id, memory.key, target, expected_version=expected)
            return f"Reverted to version {target}: new version {record.version}."

        return self._act(request, pk, act)


def history_rows(memory: Memory) -> list[dict[str, Any]]:
    """The newest :data:`HISTORY_SHOWN` versions, newest first, each with a diff against the
    version before it."""
    versions = list(
        MemoryVersion.objects.using(memory._state.db)
        .filter(memory=memory)
        .order_by("-version")
        .values("version", "op", "value", "created_at", "expires_at")[: HISTORY_SHOWN + 1]
    )
    rows = []
    for newer, older in zip(versions, [*versions[1:], None], strict=False):
        if len(rows) == HISTORY_SHOWN:
            break
        before = _pretty(older["value"]) if older and older["op"] in VALUE_OPS else ""
        after = _pretty(newer["value"]) if newer["op"] in VALUE_OPS else ""
        diff = _diff_lines(before, after)
        rows.append(
            {
                **newer,
                "diff_skipped": diff is None,
                "sizes": (len(before), len(after)),
                "diff": format_html_join(
                    "",
                    '<span class="{}">{}</span>',
                    (
                        (
                            "am-add"
                            if line.startswith("+")
                            else "am-del"
                            if line.startswith("-")
                            else "am-ctx",
                            line,
                        )
                        for line in diff or ()
                    ),
                ),
                "revertible": newer["op"] in VALUE_OPS and newer["version"] != memory.version,
            }
        )
    return rows


def _diff_lines(before: str, after: str) -> list[str] | None:
    """The unified diff of two pretty values, or None when either is too large to diff within
    the page's budget (:data:`DIFF_MAX_LINES`, :data:`DIFF_MAX_CHARS`)."""
    if max(len(before), len(after)) > DIFF_MAX_CHARS:
        return None
    old, new = before.splitlines(), after.splitlines()
    if max(len(old), len(new)) > DIFF_MAX_LINES:
        return None
    return list(difflib.unified_diff(old, new, lineterm="", n=2))[2:]


#: Items, and events, on one page of a log (newest first; older pages by keyset links).
LOG_PAGE = 50
#: Characters of an item's JSON shown (cut in the database: an item of any size reads the same).
ITEM_CHARS = 500


@admin.register(Log)
class LogAdmin(ReadOnlyAdmin):
    """Logs, read-only: the changelist of heads, and per log a page of its items and a page of
    its events, newest first, with links to older pages. What changes a log is the agent's
    calls (append, pop, clear): the admin shows, it does not edit."""

    change_form_template = "admin/agentmemory/log/change_form.html"
    list_display = [
        "session",
        "log_stream",
        "length",
        "last_seq",
        "version",
        "updated_at",
        "expiry",
    ]
    list_display_links = ["session", "log_stream"]
    search_fields = ["session_id"]
    search_help_text = (
        "A session id ('abc*' for ids starting with abc; '\"an id\"' in quotes for exactly "
        "that id); 'session/stream' for that session's streams starting with stream."
    )
    ordering = ["session_id", "stream"]  # along the unique index
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    fields = [
        "session_id",
        "stream",
        "length",
        "last_seq",
        "cleared_through",
        "version",
        "created_at",
        "updated_at",
        "expires_at",
    ]
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        condition = search_condition(connections[queryset.db], search_term, key="stream")
        return queryset.filter(condition), False

    @admin.display(description="session id", ordering="session_id")
    def session(self, log: Log) -> SafeString:
        return format_html("<bdi>{}</bdi>", log.session_id)

    @admin.display(description="stream", ordering="stream")
    def log_stream(self, log: Log) -> SafeString:
        return format_html("<bdi>{}</bdi>", log.stream)

    @admin.display(description="expires")
    def expiry(self, log: Log) -> str:
        if log.expires_at is None:
            return "never"
        if log.expires_at <= clock.now():
            return "expired"
        return log.expires_at.strftime("%Y-%m-%d %H:%M:%S")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        log = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if log is not None:
            before = page_number(request, "before")
            events_before = page_number(request, "events_before")
            items, older = log_items(log, before)
            events, older_events = log_events(log, events_before)
            context.update(
                items=items,
                older_items=older,
                events=events,
                older_events=older_events,
                newest_page=before is None and events_before is None,
                page_size=LOG_PAGE,
                expired=log.expires_at is not None and log.expires_at <= clock.now(),
            )
        return super().change_view(request, object_id, form_url, context)


def log_items(log: Log, before: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """A page of the log's items, newest first (below item number ``before``), each with its
    JSON cut at :data:`ITEM_CHARS` and its status; and the bound of the next older page (None:
    this is the oldest)."""
    items = LogItem.objects.using(log._state.db).filter(log=log)
    if before is not None:
        items = items.filter(seq__lt=before)
    rows = list(
        items.order_by("-seq")
        .annotate(preview=Left(Cast("value", TextField()), ITEM_CHARS + 1))
        .values("seq", "preview", "created_at", "removed_in")[: LOG_PAGE + 1]
    )
    older = rows[LOG_PAGE - 1]["seq"] if len(rows) > LOG_PAGE else None
    page = []
    for row in rows[:LOG_PAGE]:
        preview = row["preview"]
        if preview is not None and len(preview) > ITEM_CHARS:
            preview = preview[:ITEM_CHARS] + "…"
        if row["removed_in"] is not None:
            state, status = "popped", f"popped (e{row['removed_in']})"
        elif row["seq"] <= log.cleared_through:
            state = status = "cleared"
        else:
            state = status = "live"
        page.append({**row, "preview": preview, "state": state, "status": status})
    return page, older


def log_events(log: Log, before: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """A page of the log's events, newest first (below version ``before``), and the bound of
    the next older page (None: this is the oldest)."""
    events = LogEvent.objects.using(log._state.db).filter(log=log)
    if before is not None:
        events = events.filter(version__lt=before)
    rows = list(
        events.order_by("-version").values(
            "version", "op", "first_seq", "last_seq", "count", "created_at", "request_id"
        )[: LOG_PAGE + 1]
    )
    older = rows[LOG_PAGE - 1]["version"] if len(rows) > LOG_PAGE else None
    return rows[:LOG_PAGE], older


# The admin of LangGraph checkpoint chains (registers CheckpointThreadAdmin).
from . import checkpoint_admin  # noqa: E402, F401


@admin.register(McpToken)
class McpTokenAdmin(ReadOnlyAdmin):
    """The MCP server's bearer tokens: who they act as, named by their first characters (the
    token itself is shown once, by ``manage.py agentmemory_mcp_token create``; only its digest
    is stored). Deleting one revokes it -- from the server's next request on. Kept in
    ``AGENTMEMORY["DATABASE"]``, not with the sessions (not sharded)."""

    sharded = False

    list_display = ("prefix", "principal", "label", "created_at")
    search_fields = ("=principal", "prefix")
    fields = ("prefix", "principal", "label", "created_at")
    readonly_fields = fields
    ordering = ("principal", "created_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("agentmemory.delete_mcptoken")
