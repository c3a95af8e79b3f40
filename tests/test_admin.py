"""The admin, through Django's test client: every view and action goes through the store (a new
version, compare-and-set against what the page showed, a LogEntry, the Redis tier updated)."""

import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentmemory import MemoryStore
from agentmemory.cache import entry_version
from agentmemory.models import Memory

from .conftest import redis_alias

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent():
    """The agent writing memories: the configured store, Redis tier included."""
    redis_alias()
    return MemoryStore()


def change_url(memory_or_pk):
    pk = getattr(memory_or_pk, "pk", memory_or_pk)
    return reverse("admin:agentmemory_memory_change", args=[pk])


def memory(session_id="s", key="k"):
    return Memory.objects.get(session_id=session_id, key=key)


def versions(agent, session_id="s", key="k"):
    return [(v.version, v.op) for v in agent.history(session_id, key)]


def test_changelist_shows_memories_without_counting_the_table(admin_client, agent):
    agent.remember("s1", "prefs", {"theme": "dark", "description": "x" * 200})
    agent.remember("s2", "notes", ["a"], ttl=3600)
    agent.remember("s3", "gone", 1)
    agent.forget("s3", "gone")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse("admin:agentmemory_memory_changelist"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "s1" in page and "prefs" in page and "&quot;theme&quot;: &quot;dark&quot;" in page
    assert "x" * 200 not in page and "…" in page  # a preview, not the value
    assert "am-live" in page and "am-forgotten" in page
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts


def test_changelist_filters_and_search(admin_client, agent, settings):
    agent.remember("user-1", "prefs", 1)
    agent.remember("user-1", "plan", 2)
    agent.remember("user-2", "prefs", 3, ttl=60)
    agent.remember("other", "prefs", 4)
    agent.forget("other", "prefs")
    url = reverse("admin:agentmemory_memory_changelist")

    def rows(**params):
        response = admin_client.get(url, params)
        assert response.status_code == 200
        return sorted((m.session_id, m.key) for m in response.context["cl"].result_list)

    assert rows(q="user-*") == [("user-1", "plan"), ("user-1", "prefs"), ("user-2", "prefs")]
    assert rows(q="user-1") == [("user-1", "plan"), ("user-1", "prefs")]
    assert rows(q="user-") == []
    assert rows(q="user-1/pl") == [("user-1", "plan")]
    assert rows(status="forgotten") == [("other", "prefs")]
    assert rows(status="live") == [("user-1", "plan"), ("user-1", "prefs"), ("user-2", "prefs")]
    from agentmemory import clock

    clock.advance(120)
    assert rows(status="expired") == [("user-2", "prefs")]
    assert ("user-2", "prefs") not in rows(status="live")


def test_change_view_shows_pretty_json_and_the_history_with_diffs(admin_client, agent):
    agent.remember("s", "k", {"a": 1, "b": 2})
    agent.remember("s", "k", {"a": 1, "b": 3})
    agent.forget("s", "k")
    response = admin_client.get(change_url(memory()))
    page = response.content.decode()
    assert response.status_code == 200
    history = page[page.index('id="am-history"') :]
    assert (
        history.index("am-version-3")
        < history.index("am-version-2")
        < history.index("am-version-1")
    )
    assert '<span class="am-del">-  &quot;b&quot;: 2</span>' in history
    assert '<span class="am-add">+  &quot;b&quot;: 3</span>' in history


def test_editing_the_value_writes_a_new_version_through_the_store(admin_client, agent):
    agent.remember("s", "k", {"a": 1}, ttl=3600)
    expires = agent.recall("s", "k").expires_at
    response = admin_client.get(change_url(memory()))
    assert "&quot;a&quot;: 1" in response.content.decode()
    response = admin_client.post(
        change_url(memory()), {"value": json.dumps({"a": 2}), "loaded_version": 1}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    # The Redis tier was updated on commit: its entry holds version 2 before anything reads it
    # (a read could find the fence expired on a loaded machine and go to the database).
    assert entry_version(agent.cache.client.get(agent.cache.entry_key("s", "k"))) == 2
    record = agent.recall("s", "k")
    assert (record.version, record.value) == (2, {"a": 2})
    assert abs((record.expires_at - expires).total_seconds()) < 5  # the edit kept the expiry
    assert versions(agent) == [(1, "write"), (2, "write")]
    entry = LogEntry.objects.get()
    assert "version 1 -> 2" in entry.change_message


def test_a_concurrent_agent_write_is_reported_not_overwritten(admin_client, agent):
    agent.remember("s", "k", "v1")
    admin_client.get(change_url(memory()))  # the operator opens version 1 ...
    agent.remember("s", "k", "agent's v2")  # ... the agent writes meanwhile ...
    response = admin_client.post(change_url(memory()), {"value": '"operator"', "loaded_version": 1})
    page = response.content.decode()
    assert response.status_code == 200
    assert "This memory changed meanwhile: you loaded version 1, it is now version 2" in page
    assert agent.recall("s", "k").value == "agent's v2"
    assert versions(agent) == [(1, "write"), (2, "write")] and not LogEntry.objects.exists()


def test_a_value_that_is_not_json_is_refused_and_changes_nothing(admin_client, agent):
    agent.remember("s", "k", "v1")
    response = admin_client.post(change_url(memory()), {"value": "{not json", "loaded_version": 1})
    assert response.status_code == 200 and "Enter a valid JSON" in response.content.decode()
    assert versions(agent) == [(1, "write")]


@pytest.mark.parametrize(
    ("action", "extra", "expected_op", "recall_value"),
    [
        ("forget", {}, "forget", None),
        ("expire", {}, "expire", None),
        ("extend", {"hours": "48"}, "write", "v2"),
        ("revert", {"version": "1"}, "revert", "v1"),
    ],
)
def test_each_action_is_one_version_logged_and_cached(
    admin_client, agent, action, extra, expected_op, recall_value
):
    agent.remember("s", "k", "v1")
    agent.remember("s", "k", "v2", ttl=60)
    url = reverse(f"admin:agentmemory_memory_{action}", args=[memory().pk])
    response = admin_client.post(url, {"loaded_version": 2, **extra})
    assert response.status_code == 302
    assert versions(agent)[-1] == (3, expected_op)
    found = agent.recall("s", "k")
    assert (found.value if found else None) == recall_value
    if action == "extend":
        remaining = (found.expires_at - found.updated_at).total_seconds()
        assert abs(remaining - 48 * 3600) < 5
    assert LogEntry.objects.filter(object_id=str(memory().pk)).count() == 1


def test_actions_from_a_stale_page_change_nothing(admin_client, agent):
    agent.remember("s", "k", "v1")
    agent.remember("s", "k", "v2")
    for action, extra in [
        ("forget", {}),
        ("expire", {}),
        ("extend", {"hours": "1"}),
        ("revert", {"version": "1"}),
    ]:
        url = reverse(f"admin:agentmemory_memory_{action}", args=[memory().pk])
        response = admin_client.post(url, {"loaded_version": 1, **extra}, follow=True)
        assert "changed meanwhile: the page showed version 1, it is now version 2" in (
            response.content.decode()
        ), action
    assert versions(agent) == [(1, "write"), (2, "write")] and not LogEntry.objects.exists()
    response = admin_client.post(
        reverse("admin:agentmemory_memory_extend", args=[memory().pk]),
        {"loaded_version": 2, "hours": "soon"},
        follow=True,
    )
    assert "give the new time to live in hours" in response.content.decode()
    assert (
        admin_client.get(reverse("admin:agentmemory_memory_forget", args=[memory().pk])).status_code
        == 405
    )


def bulk(admin_client, action, memories, *, confirm=True, follow=True):
    """The changelist's action for these memories; with ``confirm``, then its confirmation page
    posted back as the operator would (the versions it showed included)."""
    url = reverse("admin:agentmemory_memory_changelist")
    ids = [str(m.pk) for m in memories]
    page = admin_client.post(url, {"action": action, "_selected_action": ids})
    if not confirm:
        return page
    assert page.status_code == 200 and 'id="am-bulk-confirm"' in page.content.decode()
    shown = {f"loaded_version_{m.pk}": str(page_version(page, m)) for m in memories}
    form = {"action": action, "_selected_action": ids, "confirmed": "yes", **shown}
    return admin_client.post(url, form, follow=follow)


def page_version(page, memory):
    html = page.content.decode()
    marker = f'name="loaded_version_{memory.pk}" value="'
    return int(html[html.index(marker) + len(marker) :].split('"')[0])


def test_bulk_forget_and_expire_ask_first_then_change(admin_client, agent):
    for key in ("a", "b", "c"):
        agent.remember("s", key, key)
    page = bulk(admin_client, "forget_selected", [memory(key="a"), memory(key="b")], confirm=False)
    assert "Forget 2 memories?" in page.content.decode()
    assert agent.recall_many("s", ["a", "b"]).keys() == {"a", "b"}  # nothing yet
    response = bulk(admin_client, "forget_selected", [memory(key="a"), memory(key="b")])
    assert "Forgot 2 memories" in response.content.decode()
    bulk(admin_client, "expire_selected", [memory(key="c")])
    assert agent.recall_many("s", ["a", "b", "c"]) == {}
    assert versions(agent, key="c") == [(1, "write"), (2, "expire")]
    assert LogEntry.objects.count() == 3


def test_bulk_actions_leave_alone_what_changed_after_the_confirmation_page(admin_client, agent):
    agent.remember("s", "a", 1)
    agent.remember("s", "b", 1)
    url = reverse("admin:agentmemory_memory_changelist")
    ids = [str(memory(key="a").pk), str(memory(key="b").pk)]
    admin_client.post(url, {"action": "forget_selected", "_selected_action": ids})
    agent.remember("s", "b", "written by the agent meanwhile")
    form = {
        "action": "forget_selected",
        "_selected_action": ids,
        "confirmed": "yes",
        f"loaded_version_{ids[0]}": "1",
        f"loaded_version_{ids[1]}": "1",
    }
    page = admin_client.post(url, form, follow=True).content.decode()
    assert "Forgot 1 memories" in page and "Left 1 unchanged" in page
    assert agent.recall("s", "b").value == "written by the agent meanwhile"
    assert versions(agent, key="b") == [(1, "write"), (2, "write")]
    assert versions(agent, key="a") == [(1, "write"), (2, "forget")]


def test_admin_prefix_search_is_exact_and_bulk_actions_stay_inside_it(admin_client, agent):
    for session_id in ("acme-1", "ACME-1", "Acme-2", "acme-2", "acmf"):
        agent.remember(session_id, "key-1", 1)
        agent.remember(session_id, "KEY-2", 1)
    url = reverse("admin:agentmemory_memory_changelist")

    def rows(q):
        result = admin_client.get(url, {"q": q}).context["cl"].result_list
        return sorted((m.session_id, m.key) for m in result)

    assert rows("acme*") == [
        ("acme-1", "KEY-2"),
        ("acme-1", "key-1"),
        ("acme-2", "KEY-2"),
        ("acme-2", "key-1"),
    ]
    assert rows("acme-1/key") == [("acme-1", "key-1")]
    assert rows("ACME-1/KEY") == [("ACME-1", "KEY-2")]
    selected = list(admin_client.get(url, {"q": "acme*"}).context["cl"].result_list)
    bulk(admin_client, "forget_selected", selected)
    for session_id in ("ACME-1", "Acme-2", "acmf"):
        assert agent.recall_many(session_id).keys() == {"key-1", "KEY-2"}
    assert agent.recall_many("acme-1") == {} and agent.recall_many("acme-2") == {}


def test_ids_are_isolated_from_the_page_text(admin_client, agent):
    """Bidirectional-text controls are refused in new ids; a row that has one anyway (written
    before, or by hand) cannot reorder the page around it."""
    agent.remember("s", "k", 1)
    Memory.objects.filter(key="k").update(key="live\u202eevil")
    page = admin_client.get(reverse("admin:agentmemory_memory_changelist")).content.decode()
    assert "<bdi>live\u202eevil</bdi>" in page
    change = admin_client.get(change_url(Memory.objects.get())).content.decode()
    assert "<bdi>live\u202eevil</bdi>" in change
    assert "live\u202eevil v1" not in change and "live\\u202eevil v1" in change  # the title


def test_history_diff_is_bounded_whatever_the_values(admin_client, agent, settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "MAX_VALUE_BYTES": 4 * 1024 * 1024}
    for n in range(3):
        agent.remember("s", "big", [f"{n}-{i}" for i in range(120_000)])  # ~1.3 MB each
    agent.remember("s", "big", ["small", 1])
    agent.remember("s", "big", ["small", 2])
    page = admin_client.get(change_url(memory(key="big"))).content.decode()
    assert page.count("too large to diff here") == 4  # v1 to v4: each has a big side
    assert '<span class="am-add">+  2</span>' in page  # small pairs are still diffed


def test_view_permission_sees_but_cannot_act(client, agent):
    agent.remember("s", "k", {"secret": "plan"})
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_memory"))
    client.force_login(viewer)
    page = client.get(change_url(memory())).content.decode()
    assert "secret" in page and 'id="am-history"' in page
    assert 'id="am-forget"' not in page and "am-revert" not in page and "<textarea" not in page
    for action in ("forget", "expire", "extend", "revert"):
        url = reverse(f"admin:agentmemory_memory_{action}", args=[memory().pk])
        assert client.post(url, {"loaded_version": 1, "version": 1, "hours": 1}).status_code == 403
    assert client.post(change_url(memory()), {"value": "1", "loaded_version": 1}).status_code == 403
    assert versions(agent) == [(1, "write")]
    changelist = client.get(reverse("admin:agentmemory_memory_changelist")).content.decode()
    assert "forget_selected" not in changelist


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_admin_reads_and_writes_the_configured_database(admin_client, settings):
    """With AGENTMEMORY["DATABASE"] = "other", the admin shows and changes that database's
    memories, not default's."""
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "DATABASE": "other", "CACHE": None}
    other, default = (
        MemoryStore(using="other", cache=None),
        MemoryStore(using="default", cache=None),
    )
    other.remember("s", "k", "in other")
    default.remember("s", "k", "in default")
    default.remember("s", "only-default", 1)
    page = admin_client.get(reverse("admin:agentmemory_memory_changelist"))
    assert [(m.key, m.version) for m in page.context["cl"].result_list] == [("k", 1)]
    pk = Memory.objects.using("other").get(key="k").pk
    change = admin_client.post(change_url(pk), {"value": '"edited"', "loaded_version": 1})
    assert change.status_code == 302
    assert (
        other.recall("s", "k").value == "edited" and default.recall("s", "k").value == "in default"
    )
    admin_client.post(reverse("admin:agentmemory_memory_forget", args=[pk]), {"loaded_version": 2})
    assert other.recall("s", "k") is None and default.recall("s", "k").version == 1


def test_a_memorys_page_says_where_its_pruned_history_starts(admin_client, agent):
    for i in range(5):
        agent.remember("s", "k", i)
    agent.prune_history(keep_last=2)
    page = admin_client.get(change_url(memory())).content.decode()
    assert "versions before v4 were pruned" in page
    assert 'id="am-version-5"' in page and 'id="am-version-3"' not in page


@pytest.mark.parametrize(
    ("posted", "message"),
    [
        ('"\\ud800"', "lone surrogate (U+D800"),
        ("[" * 100_000 + "]" * 100_000, "deeper than the limit of 30"),
        ("[" * 40 + "]" * 40, "deeper than the limit of 30"),
        ("", "an empty value is not JSON"),
        ("   \n", "an empty value is not JSON"),
        ("NaN", "NaN"),
    ],
)
def test_a_value_the_store_refuses_is_a_form_error_never_a_server_error(
    admin_client, agent, posted, message
):
    agent.remember("s", "k", "v1")
    response = admin_client.post(change_url(memory()), {"value": posted, "loaded_version": 1})
    page = response.content.decode()  # the page itself encodes (no raw surrogate in it)
    assert response.status_code == 200
    assert message in page, page[:3000]
    assert versions(agent) == [(1, "write")] and not LogEntry.objects.exists()


def test_null_typed_as_json_is_a_value(admin_client, agent):
    agent.remember("s", "k", "v1")
    response = admin_client.post(change_url(memory()), {"value": "null", "loaded_version": 1})
    assert response.status_code == 302
    assert agent.recall("s", "k").value is None


def test_saving_an_unchanged_value_writes_nothing_and_says_so(admin_client, agent):
    agent.remember("s", "k", {"a": 1, "b": [1, 2]})
    response = admin_client.post(
        change_url(memory()),
        {"value": '{"b": [1, 2],\n "a": 1}', "loaded_version": 1},
        follow=True,
    )
    assert response.status_code == 200
    assert "Nothing was saved: the value is the same as version 1" in response.content.decode()
    assert versions(agent) == [(1, "write")] and not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "query", ["value__contains=x", "key__regex=.*", "value__a=1", "session_id__iregex=x"]
)
def test_only_the_declared_filters_come_from_the_query_string(admin_client, agent, query):
    agent.remember("s", "k", "v1")
    response = admin_client.get(reverse("admin:agentmemory_memory_changelist") + "?" + query)
    assert response.status_code == 400


def test_the_date_filter_still_comes_from_the_query_string(admin_client, agent):
    agent.remember("s", "k", "v1")
    url = reverse("admin:agentmemory_memory_changelist")
    response = admin_client.get(url, {"updated_at__gte": "2000-01-01"})
    assert response.status_code == 200 and len(response.context["cl"].result_list) == 1


def test_ids_with_slashes_and_spaces_are_found_by_search(admin_client, agent):
    agent.remember("user/42", "notes", 1)
    agent.remember("user", "42/other", 2)
    agent.remember(" spaced", "k", 3)
    agent.remember("spaced", "k", 4)
    url = reverse("admin:agentmemory_memory_changelist")

    def rows(q):
        response = admin_client.get(url, {"q": q})
        assert response.status_code == 200
        return sorted((m.session_id, m.key) for m in response.context["cl"].result_list)

    assert rows("user/42") == [("user", "42/other"), ("user/42", "notes")]
    assert rows('"user/42"') == [("user/42", "notes")]
    assert rows("user/42/no") == [("user/42", "notes")]
    assert rows('" spaced"') == [(" spaced", "k")]
    assert rows(" spaced") == [(" spaced", "k"), ("spaced", "k")]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_on_shards_the_admin_shows_one_shard_at_a_time_and_acts_on_that_shards_row(
    admin_client, settings
):
    """With AGENTMEMORY["SHARDS"], the list shows one shard (the first by default, another by
    its filter), and a row's page, its edit and its actions reach that shard's row -- though the
    other shard has a row of the same primary key."""
    from django.utils import timezone

    from agentmemory import ShardedStore

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": ["default", "other"], "CACHE": None}
    sharded = ShardedStore(cache=None)
    on = {sharded.place(f"user-{n}"): f"user-{n}" for n in range(20)}
    for alias, session_id in on.items():
        sharded.remember(session_id, "k", f"in {alias}")
    pk = Memory.objects.using("other").get(session_id=on["other"]).pk
    changelist = reverse("admin:agentmemory_memory_changelist")
    page = admin_client.get(changelist)
    assert [m.session_id for m in page.context["cl"].result_list] == [on["default"]]
    assert 'href="?shard=other"' in page.content.decode()
    page = admin_client.get(changelist + "?shard=other")
    assert [m.session_id for m in page.context["cl"].result_list] == [on["other"]]
    assert "_changelist_filters=shard%3Dother" in page.content.decode()  # rows keep the shard
    if not Memory.objects.using("default").filter(pk=pk).exists():
        # The same primary key on both shards (ids count on per database): a row of it on
        # default, so that a page that read the wrong shard would show it.
        Memory.objects.using("default").create(
            pk=pk,
            session_id=on["default"],
            key="collider",
            value="collider",
            version=1,
            created_at=timezone.now(),
            updated_at=timezone.now(),
        )
    collider = Memory.objects.using("default").get(pk=pk)
    row = change_url(pk) + "?_changelist_filters=shard%3Dother"
    assert f"<title>{on['other']}/k v1 " in admin_client.get(row).content.decode()
    edited = admin_client.post(row, {"value": '"edited"', "loaded_version": 1})
    assert edited.status_code == 302 and edited["Location"].endswith("?shard=other")
    assert sharded.recall(on["other"], "k").value == "edited"
    assert sharded.recall(on["default"], "k").value == "in default"
    forget = reverse("admin:agentmemory_memory_forget", args=[pk]) + "?shard=other"
    done = admin_client.post(forget, {"loaded_version": 2})
    assert done.status_code == 302 and done["Location"].endswith("?shard=other")
    assert sharded.recall(on["other"], "k") is None
    assert sharded.recall(on["default"], "k").version == 1
    again = Memory.objects.using("default").get(pk=pk)
    assert (again.value, again.version) == (collider.value, collider.version)
    # A name that is no shard -- another case, a trailing space -- shows the first, never an
    # error and never the shard it resembles.
    for name in ("nope", "OTHER", "other%20"):
        page = admin_client.get(changelist + f"?shard={name}")
        assert page.status_code == 200, name
        assert {m.session_id for m in page.context["cl"].result_list} == {on["default"]}, name


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_on_shards_the_mcp_tokens_stay_in_the_configured_database(admin_client, settings):
    from agentmemory.integrations.mcp import create_token
    from agentmemory.models import McpToken

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": ["other"], "CACHE": None}
    create_token("alice", label="laptop", using="default")
    page = admin_client.get(reverse("admin:agentmemory_mcptoken_changelist"))
    assert [t.principal for t in page.context["cl"].result_list] == ["alice"]
    assert "?shard=" not in page.content.decode()
    assert not McpToken.objects.using("other").exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_on_shards_the_logs_and_checkpoint_chains_are_listed_one_shard_at_a_time(
    admin_client, settings
):
    from agentmemory import ShardedStore
    from agentmemory.integrations.langgraph import AgentMemorySaver

    from .test_langgraph_checkpointer import config, put_step

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": ["default", "other"], "CACHE": None}
    sharded = ShardedStore(cache=None)
    on = {sharded.place(f"user-{n}"): f"user-{n}" for n in range(20)}
    saver = AgentMemorySaver(sharded)
    for session_id in on.values():
        sharded.append(session_id, "chat", ["hello"])
        put_step(saver, config(session_id), 1)
    for alias, session_id in on.items():
        for name in ("log", "checkpointthread"):
            url = reverse(f"admin:agentmemory_{name}_changelist") + f"?shard={alias}"
            page = admin_client.get(url)
            assert page.status_code == 200, (name, alias)
            shown = [
                row.session_id if name == "log" else row.thread_id
                for row in page.context["cl"].result_list
            ]
            assert shown == [session_id], (name, alias, shown)
