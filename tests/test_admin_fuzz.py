"""Every admin page of agentmemory's models answers any query string with a page, a redirect or a
400 -- never a server error (#42: ``?before=%C2%B2``, ``?events_before=``, ``?writes_after=``,
``?session_id__regex=%5B``, ``?expires_at__year=99999`` and a NUL in any parameter on
PostgreSQL gave 500s). Hypothesis draws parameters -- the pages' own, Django admin's, lookups of
the models' fields, hostile names -- and values, on every backend of the suite."""

from __future__ import annotations

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint

from agentmemory import MemoryStore
from agentmemory.integrations.langgraph import AgentMemorySaver
from agentmemory.integrations.mcp import create_token
from agentmemory.models import CheckpointThread, Log, McpToken, Memory

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = [
    # the pages' own
    "before", "events_before", "writes_after", "writes_of", "page", "q", "status",
    "updated_at__gte", "updated_at__lt", "updated_at__isnull",
    # Django admin's
    "o", "p", "e", "all", "_popup", "_to_field", "_changelist_filters",
    # lookups of the models' own fields, and hostile names
    "session_id__regex", "key__iregex", "expires_at__year", "version__gt", "id__in",
    "session_id", "thread_id__startswith", "\x00", "a\x00b", "%", "",
]  # fmt: skip
VALUES = [
    "", "\x00", "a\x00", "²", "٣", "0", "-1", "1", "9" * 30, "99999", "1e309", "nan", "[", "(",
    "%", "_", "'", '"', "\\", "a" * 5000, "2026-13-45", "2026-01-01", "true", "null", "é",
    "\u202e", "1,2", "s", "chat",
]  # fmt: skip


@pytest.fixture
def pages(admin_client) -> list[str]:
    store = MemoryStore(cache=None)
    store.remember("s", "k", {"a": 1})
    store.remember("s", "k", {"a": 2})
    store.append("s", "chat", ["hi", "there"])
    store.pop("s", "chat")
    saver = AgentMemorySaver(store)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = saver.put(config, empty_checkpoint(), {"step": 0}, {})
    saver.put_writes(stored, [("channel", 1)], task_id="task")
    create_token("alice")
    urls = []
    for model, pk in [
        ("memory", Memory.objects.get().pk),
        ("log", Log.objects.get().pk),
        ("checkpointthread", CheckpointThread.objects.get().pk),
        ("mcptoken", McpToken.objects.get().pk),
    ]:
        urls += [
            reverse(f"admin:agentmemory_{model}_changelist"),
            reverse(f"admin:agentmemory_{model}_change", args=[pk]),
            reverse(f"admin:agentmemory_{model}_history", args=[pk]),
        ]
    return urls


#: What each kind of page reads (and Django admin's own), plus lookups it must refuse.
HOSTILE_NAMES = ["session_id__regex", "expires_at__year", "id__in", "\x00", ""]
READS = {
    "changelist": ["q", "o", "p", "e", "all", "status", "updated_at__gte", "updated_at__lt",
                   "updated_at__isnull", "_popup", "_to_field", *HOSTILE_NAMES],
    "change": ["before", "events_before", "writes_after", "writes_of", "_changelist_filters",
               "_popup", "_to_field", *HOSTILE_NAMES],
    "history": ["p", "_changelist_filters", *HOSTILE_NAMES],
}  # fmt: skip


def test_every_value_of_every_parameter_a_page_reads(admin_client, pages):
    for index, url in enumerate(pages):
        kind = ["changelist", "change", "history"][index % 3]
        for name in READS[kind]:
            for value in VALUES:
                response = admin_client.get(url, {name: value})
                assert response.status_code < 500, (url, name, value)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    page=st.integers(0, 8),
    params=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=3),
)
def test_no_combination_of_parameters_makes_an_admin_page_fail(admin_client, pages, page, params):
    url = pages[page]
    response = admin_client.get(url, dict(params))
    assert response.status_code < 500, (url, params)


@pytest.mark.parametrize(
    ("page", "query"),
    [
        (1, {"before": "²"}),
        (4, {"events_before": "²"}),
        (7, {"writes_after": "²"}),
        (7, {"before": "a\x00b"}),
        (0, {"session_id__regex": "["}),
        (0, {"expires_at__year": "99999"}),
        (0, {"q": "a\x00"}),
    ],
)
def test_the_reported_parameters_get_a_page_or_a_400(admin_client, pages, page, query):
    response = admin_client.get(pages[page], query)
    assert response.status_code in (200, 302, 400), response.status_code
