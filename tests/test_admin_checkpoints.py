"""The admin's pages of LangGraph checkpoint chains, through Django's test client: the changelist
of chains, and per chain its checkpoints and one checkpoint's pending writes a page at a time
(keyset pages, whatever the chain's length), read-only."""

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from langgraph.checkpoint.base import empty_checkpoint

from agentmemory.checkpoint_admin import CHECKPOINT_PAGE
from agentmemory.integrations.langgraph import AgentMemorySaver
from agentmemory.models import CheckpointThread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saver():
    return AgentMemorySaver()


def chain(saver, thread="t", count=3, ns=""):
    """A chain of ``count`` checkpoints; their ids, oldest first."""
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    ids = []
    for step in range(count):
        checkpoint = empty_checkpoint()
        saved = saver.put(config, checkpoint, {"source": "loop", "step": step, "run_id": "r1"}, {})
        config = saved
        ids.append(checkpoint["id"])
    return ids


def chain_url(thread="t", ns="", **query):
    pk = CheckpointThread.objects.get(thread_id=thread, checkpoint_ns=ns).pk
    url = reverse("admin:agentmemory_checkpointthread_change", args=[pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def rows(page, what="checkpoint"):
    return page.count(f'class="am-{what}')


def test_changelist_lists_chains_and_searches_by_thread(admin_client, saver):
    chain(saver, "user-1")
    chain(saver, "user-1", ns="child:a")
    chain(saver, "user-2")
    url = reverse("admin:agentmemory_checkpointthread_changelist")
    listed = admin_client.get(url).context["cl"].result_list
    assert [(c.thread_id, c.checkpoint_ns) for c in listed] == [
        ("user-1", ""),
        ("user-1", "child:a"),
        ("user-2", ""),
    ]
    found = admin_client.get(url, {"q": "user-2"}).context["cl"].result_list
    assert [c.thread_id for c in found] == ["user-2"]
    assert len(admin_client.get(url, {"q": "user*"}).context["cl"].result_list) == 3


def test_a_chains_page_shows_its_newest_checkpoints_then_older_pages(admin_client, saver):
    ids = chain(saver, count=CHECKPOINT_PAGE + 10)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(chain_url()).content.decode()
    assert rows(page) == CHECKPOINT_PAGE and ids[-1] in page and ids[8] not in page
    assert "<td>loop</td><td>59</td>" in page and "<code>r1</code>" in page
    assert len(queries) < 20  # a page, whatever the chain's length
    older = admin_client.get(chain_url(before=ids[10])).content.decode()
    assert rows(older) == 10 and ids[0] in older and 'id="am-newest"' in older
    assert 'id="am-older-checkpoints"' not in older


def test_a_checkpoints_pending_writes_are_shown_with_their_tasks(admin_client, saver):
    ids = chain(saver)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": ids[1]}}
    saver.put_writes(config, [("messages", "hi"), ("count", 1)], "task-a", "~node")
    page = admin_client.get(chain_url(writes_of=ids[1])).content.decode()
    assert rows(page, "write") == 2 and "task-a" in page and "<bdi>messages</bdi>" in page
    newest = admin_client.get(chain_url()).content.decode()
    assert f"writes_of={ids[1]}" in newest and rows(newest, "write") == 0


def test_a_bad_bound_shows_the_newest_page(admin_client, saver):
    chain(saver)
    for bad in ("x" * 300, ""):
        response = admin_client.get(chain_url(before=bad))
        assert response.status_code == 200 and rows(response.content.decode()) == 3


def test_chains_are_read_only_in_the_admin(admin_client, saver):
    chain(saver)
    pk = CheckpointThread.objects.get().pk
    response = admin_client.post(reverse("admin:agentmemory_checkpointthread_change", args=[pk]))
    assert response.status_code == 403
    assert admin_client.get(reverse("admin:agentmemory_checkpointthread_add")).status_code == 403
    delete = reverse("admin:agentmemory_checkpointthread_delete", args=[pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 3


def test_view_permission_is_enough_to_read_a_chain(client, saver):
    ids = chain(saver)
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_checkpointthread"))
    client.force_login(user)
    assert ids[-1] in client.get(chain_url()).content.decode()
