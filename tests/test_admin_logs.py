"""The admin's log pages, through Django's test client: the changelist of logs without counting
the table, and per log its items and events a page at a time (keyset pages), read-only."""

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentmemory import MemoryStore
from agentmemory.admin import ITEM_CHARS, LOG_PAGE
from agentmemory.models import Log

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent():
    return MemoryStore(cache=None)


def log_url(session_id="s", stream="chat", **query):
    pk = Log.objects.get(session_id=session_id, stream=stream).pk
    url = reverse("admin:agentmemory_log_change", args=[pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def shown(page, what):
    """The item numbers (``item``) or event versions (``event``) on a page, in its order."""
    marker = f'id="am-{what}-'
    return [int(part.split('"', 1)[0]) for part in page.split(marker)[1:]]


def test_changelist_lists_logs_and_searches_by_session_and_stream(admin_client, agent):
    agent.append("s1", "chat", ["hi"])
    agent.append("s1", "tools", ["t"])
    agent.append("s2", "chat", ["yo"])
    url = reverse("admin:agentmemory_log_changelist")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url)
    assert page.status_code == 200
    assert not [q for q in queries if "COUNT(*)" in q["sql"] and "LIMIT" not in q["sql"]]
    rows = [(log.session_id, log.stream) for log in page.context["cl"].result_list]
    assert rows == [("s1", "chat"), ("s1", "tools"), ("s2", "chat")]
    found = admin_client.get(url, {"q": "s1/to"}).context["cl"].result_list
    assert [(log.session_id, log.stream) for log in found] == [("s1", "tools")]
    assert "<bdi>s2</bdi>" in page.content.decode()


def test_a_logs_page_shows_its_newest_items_and_events_then_older_pages(admin_client, agent):
    agent.append("s", "chat", [{"n": n} for n in range(1, LOG_PAGE + 11)])  # 60 items, e1
    agent.pop("s", "chat")  # e2 pops #60
    agent.append("s", "chat", ["after"])  # e3: #61
    page = admin_client.get(log_url()).content.decode()
    assert shown(page, "item") == list(range(61, 61 - LOG_PAGE, -1))
    assert "popped (e2)" in page and "&quot;n&quot;: 59" in page
    assert shown(page, "event") == [3, 2, 1] and 'id="am-older-events"' not in page
    assert 'href="?before=12"' in page
    older = admin_client.get(log_url(before=12)).content.decode()
    assert shown(older, "item") == list(range(11, 0, -1))
    assert 'id="am-older-items"' not in older and 'id="am-newest"' in older


def test_cleared_items_are_shown_as_cleared_and_events_page_by_version(admin_client, agent):
    for n in range(LOG_PAGE + 5):
        agent.append("s", "chat", [n])
    agent.clear_log("s", "chat")
    page = admin_client.get(log_url()).content.decode()
    assert page.count("am-item-row am-cleared") == LOG_PAGE
    assert shown(page, "event") == list(range(LOG_PAGE + 6, 6, -1))
    older = admin_client.get(log_url(events_before=7)).content.decode()
    assert shown(older, "event") == [6, 5, 4, 3, 2, 1]


def test_a_big_item_is_cut_and_a_bad_page_bound_shows_the_newest_page(admin_client, agent):
    agent.append("s", "chat", ["x" * 100_000])
    page = admin_client.get(log_url()).content.decode()
    # The JSON text's first ITEM_CHARS characters: the opening quote and the x's after it.
    assert "&quot;" + "x" * (ITEM_CHARS - 1) + "…" in page and "x" * ITEM_CHARS not in page
    for bad in ("-1", "abc", "0", str(2**70)):
        response = admin_client.get(log_url(before=bad))
        assert response.status_code == 200 and shown(response.content.decode(), "item") == [1]


def test_logs_are_read_only_in_the_admin(admin_client, agent):
    agent.append("s", "chat", ["hi"])
    page = admin_client.get(log_url()).content.decode()
    assert 'name="_save"' not in page and "<textarea" not in page
    pk = Log.objects.get().pk
    response = admin_client.post(reverse("admin:agentmemory_log_change", args=[pk]), {})
    assert response.status_code == 403
    assert admin_client.get(reverse("admin:agentmemory_log_add")).status_code == 403
    delete = reverse("admin:agentmemory_log_delete", args=[pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert agent.read_log("s", "chat")[0].value == "hi"


def test_view_permission_is_enough_to_read_a_log(client, agent):
    agent.append("s", "chat", ["secret"])
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_log"))
    client.force_login(user)
    page = client.get(log_url()).content.decode()
    assert "secret" in page and 'id="am-events"' in page
