"""agentmemory as a LangGraph BaseStore, on every backend, with and without Redis (the ``store``
fixture), and a real LangGraph graph whose parallel nodes update one memory."""

import asyncio
import operator
import time
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError
from langgraph.store.memory import InMemoryStore

from agentmemory import MemoryStore, clock
from agentmemory.errors import VersionConflict
from agentmemory.integrations.langgraph import AgentMemoryStore, namespace_of, session_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lg(store):
    return AgentMemoryStore(store)


def test_put_get_delete_and_every_put_is_a_version(lg):
    lg.put(("users", "ada"), "prefs", {"tone": "brief"})
    first = lg.get(("users", "ada"), "prefs")
    assert (first.value, first.key, first.namespace) == (
        {"tone": "brief"},
        "prefs",
        ("users", "ada"),
    )
    time.sleep(0.01)
    lg.put(("users", "ada"), "prefs", {"tone": "formal"})
    second = lg.get(("users", "ada"), "prefs")
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    second.value["tone"] = "mutated"  # a copy, never a live reference
    assert lg.get(("users", "ada"), "prefs").value == {"tone": "formal"}
    lg.delete(("users", "ada"), "prefs")
    assert lg.get(("users", "ada"), "prefs") is None
    assert [(v.version, v.op) for v in lg.history(("users", "ada"), "prefs")] == [
        (1, "write"),
        (2, "write"),
        (3, "forget"),
    ]


def test_namespaces_map_reversibly_and_look_alikes_never_meet(lg):
    look_alikes = [("a",), ("a%",), ("a_",), ("A",), ("a", "b"), ("a/b",), ("a%2Fb",), ("a ",)]
    for i, namespace in enumerate(look_alikes):
        assert namespace_of(session_of(namespace)) == namespace
        lg.put(namespace, "k", {"i": i})
    assert [lg.get(ns, "k").value["i"] for ns in look_alikes] == list(range(len(look_alikes)))
    with pytest.raises(InvalidNamespaceError, match="the limit is 128"):
        lg.put(("x" * 130,), "k", {"v": 1})


def test_search_by_prefix_with_filters_limit_and_offset(lg):
    for i in range(12):
        lg.put(("docs", "team-a" if i % 2 else "team-b"), f"d{i:02d}", {"n": i, "kind": "note"})
    lg.put(("docsx",), "other", {"n": 100, "kind": "note"})
    found = lg.search(("docs",), limit=100)
    assert len(found) == 12 and all(item.namespace[0] == "docs" for item in found)
    assert [(i.namespace, i.key) for i in found] == sorted((i.namespace, i.key) for i in found)
    assert {i.value["n"] for i in lg.search(("docs",), filter={"n": {"$gt": 9}})} == {10, 11}
    assert {i.value["n"] for i in lg.search(("docs",), filter={"n": {"$gte": 2, "$lt": 4}})} == {
        2,
        3,
    }
    assert len(lg.search(("docs", "team-a"), filter={"kind": "note"}, limit=100)) == 6
    assert len(lg.search(("docs",), filter={"n": {"$ne": 3}}, limit=100)) == 11
    page = lg.search(("docs",), limit=5, offset=10)
    assert [i.key for i in page] == [i.key for i in found][10:15]
    with pytest.raises(NotImplementedError, match="has no index"):
        lg.search(("docs",), query="similar to this")


def test_list_namespaces_with_prefix_suffix_wildcards_and_depth(lg):
    for namespace in [
        ("users", "ada", "prefs"),
        ("users", "bob", "prefs"),
        ("users", "bob", "notes"),
        ("teams", "x"),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert lg.list_namespaces(prefix=("users",)) == [
        ("users", "ada", "prefs"),
        ("users", "bob", "notes"),
        ("users", "bob", "prefs"),
    ]
    assert lg.list_namespaces(suffix=("prefs",)) == [
        ("users", "ada", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert lg.list_namespaces(prefix=("users", "*", "notes")) == [("users", "bob", "notes")]
    assert lg.list_namespaces(max_depth=2) == [("teams", "x"), ("users", "ada"), ("users", "bob")]
    assert lg.list_namespaces(limit=2, offset=1) == [
        ("users", "ada", "prefs"),
        ("users", "bob", "notes"),
    ]


def test_ttl_in_minutes_refresh_on_read_and_expired_items_never_returned(lg):
    lg.put(("s",), "short", {"v": 1}, ttl=1)  # one minute
    lg.put(("s",), "kept", {"v": 2})
    clock.advance(50)
    assert lg.get(("s",), "short") is not None  # refreshes: one more minute from now
    clock.advance(50)
    assert lg.get(("s",), "short", refresh_ttl=False) is not None
    clock.advance(20)
    assert lg.get(("s",), "short") is None
    assert [i.key for i in lg.search(("s",))] == ["kept"]
    plain = AgentMemoryStore(lg.store, ttl={"refresh_on_read": False, "default_ttl": 1})
    plain.put(("t",), "k", {"v": 1})
    clock.advance(50)
    assert plain.get(("t",), "k") is not None
    clock.advance(20)
    assert plain.get(("t",), "k") is None


def test_ttl_none_means_never_expires_even_under_a_default_ttl(lg):
    """As LangGraph documents: an omitted TTL takes ``default_ttl``; ``ttl=None`` means never."""
    store = AgentMemoryStore(lg.store, ttl={"refresh_on_read": False, "default_ttl": 1})
    store.put(("t",), "forever", {"v": 1}, ttl=None)
    store.put(("t",), "default", {"v": 1})
    assert store.put_if_version(("t",), "cas-forever", {"v": 1}, 0, ttl=None) == 1
    store.modify(("t",), "modify-forever", lambda _: {"v": 1}, ttl=None)
    clock.advance(24 * 3600)
    assert store.get(("t",), "default") is None
    for key in ("forever", "cas-forever", "modify-forever"):
        assert store.get(("t",), key).value == {"v": 1}, key


@pytest.mark.parametrize("field", ["a b", "x'; DROP", "a$", "", "ü"])
def test_invalid_filter_keys_are_refused_as_langgraphs_sql_stores_do(lg, field):
    lg.put(("s",), "k", {"a": 1})
    with pytest.raises(ValueError, match="Invalid filter key"):
        lg.search(("s",), filter={field: 1})
    assert [i.key for i in lg.search(("s",), filter={"a": 1, "nested.field-x_1": 2})] == []
    assert [i.key for i in lg.search(("s",), filter={"a": 1})] == ["k"]


def test_sync_calls_on_a_running_event_loop_are_refused_naming_the_async_method(lg):
    async def main():
        with pytest.raises(asyncio.InvalidStateError, match=r"await store\.aget"):
            lg.get(("s",), "k")
        with pytest.raises(asyncio.InvalidStateError, match=r"await store\.amodify"):
            lg.modify(("s",), "k", lambda _: {"v": 1})
        await lg.aput(("s",), "k", {"v": 1})
        await lg.amodify(("s",), "k", lambda v: {"v": v["v"] + 1})
        return await lg.aget(("s",), "k"), await lg.aversion_of(("s",), "k")

    item, version = asyncio.run(main())
    assert (item.value, version) == ({"v": 2}, 2)


def test_compare_and_set_put_and_read_modify_write(lg):
    assert lg.put_if_version(("s",), "k", {"n": 1}, expected_version=0) == 1
    with pytest.raises(VersionConflict):
        lg.put_if_version(("s",), "k", {"n": 2}, expected_version=0)
    assert lg.version_of(("s",), "k") == 1
    item = lg.modify(("s",), "k", lambda v: {"n": v["n"] + 1})
    assert item.value == {"n": 2}


def test_async_twins(lg):
    async def main():
        await lg.aput(("s",), "k", {"v": 1})
        return await lg.aget(("s",), "k"), await lg.asearch(("s",))

    item, found = asyncio.run(main())
    assert item.value == {"v": 1} and [i.key for i in found] == ["k"]


# ---------------------------------------------------------------- a real graph, parallel nodes

NODES, NAMESPACE = 8, ("team", "shared")


class State(TypedDict):
    done: Annotated[list[int], operator.add]


def bump(store: BaseStore) -> None:
    """What a node does to shared memory: the read-modify-write helper where the store has one,
    else what LangGraph users write -- get, think (an LLM call), put."""
    if isinstance(store, AgentMemoryStore):
        store.modify(NAMESPACE, "counter", lambda v: {"n": (v or {}).get("n", 0) + 1})
        return
    item = store.get(NAMESPACE, "counter")
    time.sleep(0.05)
    store.put(NAMESPACE, "counter", {"n": (item.value["n"] if item else 0) + 1})


def run_graph(store: BaseStore) -> int:
    builder = StateGraph(State)
    for i in range(NODES):

        def node(state: State, *, store: BaseStore, i: int = i) -> dict:
            bump(store)
            return {"done": [i]}

        builder.add_node(f"n{i}", node)
        builder.add_edge(START, f"n{i}")
    graph = builder.compile(store=store)
    assert sorted(graph.invoke({"done": []})["done"]) == list(range(NODES))
    return store.get(NAMESPACE, "counter").value["n"]


def test_parallel_nodes_lose_nothing_here_and_lose_updates_on_langgraphs_own_store(lg):
    assert run_graph(lg) == NODES  # 8 updates written, 8 kept
    assert len(lg.history(NAMESPACE, "counter")) == NODES
    assert run_graph(InMemoryStore()) < NODES  # LangGraph's store: last write wins


# ------------------------------------------------------------------ semantic search (index=)

DIMS = 256
DOCS = {
    ("docs", "pets"): {"text": "the cat sat on the mat", "n": 1},
    ("docs", "pets", "dogs"): {"text": "a dog chased a ball across the park", "n": 2},
    ("docs", "science"): {"text": "quantum physics lecture about particles", "n": 3},
    ("docs", "food"): {"text": "a recipe for cat shaped cookies", "n": 4},
    ("other",): {"text": "the cat on the mat again", "n": 5},
}


def semantic_pair(fields=("text",), **extra):
    """agentmemory's store and LangGraph's InMemoryStore, same index config, same data."""
    from agentmemory.testing.embeddings import HashEmbedder

    config = {"dims": DIMS, "embed": HashEmbedder(DIMS), "fields": list(fields), **extra}
    ours = AgentMemoryStore(index=config)
    theirs = InMemoryStore(index={k: v for k, v in config.items() if k != "distance_type"})
    for (*namespace, label), value in DOCS.items():
        for store in (ours, theirs):
            store.put((*namespace, label), f"k-{label}", value)
    return ours, theirs


def ranked(items):
    """Best first; equal scores in (namespace, key) order (LangGraph's InMemoryStore leaves
    them in insertion order). Items without a score -- InMemoryStore pads a short result with
    unindexed items; PostgresStore, and agentmemory, return indexed items only -- are left out."""
    scored = [(-round(i.score, 5), i.namespace, i.key) for i in items if i.score is not None]
    return [(namespace, key, -score) for score, namespace, key in sorted(scored)]


@pytest.mark.parametrize(
    ("prefix", "query", "extra"),
    [
        (("docs",), "a cat on a mat", {}),
        ((), "cat cookies recipe", {}),
        (("docs",), "physics particles", {}),
        (("docs", "pets"), "cat dog park", {}),
        (("docs",), "cat", {"filter": {"n": {"$gte": 2}}}),
    ],
)
def test_search_by_meaning_ranks_and_scores_as_langgraphs_own_store(prefix, query, extra):
    ours, theirs = semantic_pair()
    found = ours.search(prefix, query=query, **extra)
    assert ranked(found) == ranked(theirs.search(prefix, query=query, **extra))
    assert [r.score for r in found] == sorted((r.score for r in found), reverse=True)
    assert ranked(ours.search(prefix, query=query, limit=2, offset=1, **extra)) == ranked(
        found[1:3]
    )


def test_search_by_meaning_after_overwrites_deletes_and_per_put_index():
    ours, theirs = semantic_pair()
    for store in (ours, theirs):
        store.put(("docs", "pets"), "k-pets", {"text": "physics of a cat", "n": 1})
        store.delete(("docs", "food"), "k-food")
        store.put(("docs",), "hidden", {"text": "cat cat cat"}, index=False)
        store.put(("docs",), "titled", {"text": "nothing", "title": "cat mat"}, index=["title"])
    for query in ("a cat on a mat", "physics", "cat"):
        assert ranked(ours.search(("docs",), query=query)) == ranked(
            theirs.search(("docs",), query=query)
        )
    assert "hidden" not in {i.key for i in ours.search(("docs",), query="cat")}


def test_search_by_meaning_with_the_whole_value_indexed_and_async():
    ours, theirs = semantic_pair(fields=("$",))

    async def both():
        return await ours.asearch(("docs",), query="cat mat"), await theirs.asearch(
            ("docs",), query="cat mat"
        )

    mine, reference = asyncio.run(both())
    assert ranked(mine) == ranked(reference)


def test_an_index_needs_a_known_distance_and_its_keys():
    with pytest.raises(ValueError, match="cosine, l2, inner_product"):
        AgentMemoryStore(index={"dims": 4, "embed": lambda t: [], "distance_type": "hamming"})
    with pytest.raises(ValueError, match="'dims'"):
        AgentMemoryStore(index={"embed": lambda t: []})


def test_a_search_page_of_zero_is_empty_and_a_negative_page_is_refused(lg):
    for i in range(3):
        lg.put(("docs",), f"k{i}", {"n": i})
    assert lg.search(("docs",), limit=0) == []
    assert lg.list_namespaces(limit=0) == []
    assert [i.key for i in lg.search(("docs",), limit=1, offset=2)] == ["k2"]
    for page in ({"limit": -1}, {"offset": -1}, {"limit": "2"}):
        with pytest.raises(ValueError, match=next(iter(page))):
            lg.search(("docs",), **page)
        with pytest.raises(ValueError, match=next(iter(page))):
            lg.list_namespaces(**page)


def test_a_semantic_search_page_of_zero_is_empty():
    ours, _ = semantic_pair()
    assert ours.search(("docs",), query="cat", limit=0) == []
    with pytest.raises(ValueError, match="offset"):
        ours.search(("docs",), query="cat", offset=-1)


def test_a_bad_page_in_a_batch_writes_nothing_of_the_batch(lg):
    from langgraph.store.base import PutOp, SearchOp

    with pytest.raises(ValueError, match="limit"):
        lg.batch([PutOp(("docs",), "k", {"v": 1}), SearchOp(("docs",), limit=-1)])
    assert lg.get(("docs",), "k") is None


@pytest.mark.parametrize("returned", [None, [("a", 1)], "text", 42])
def test_modify_whose_fn_returns_no_dict_is_a_clear_error_and_writes_nothing(lg, returned):
    from agentmemory import InvalidMemory

    lg.put(("docs",), "k", {"v": 1})
    with pytest.raises(InvalidMemory, match="must return the item's new value, a dict") as error:
        lg.modify(("docs",), "k", lambda _current: returned)
    assert error.value.field == "fn"
    assert lg.get(("docs",), "k").value == {"v": 1}
    assert len(lg.history(("docs",), "k")) == 1


def test_text_fields_the_sql_stores_spelling_is_the_index_fields():
    """LangGraph's SqliteStore and its tests spell the paths ``text_fields``: a value is then
    embedded at those paths only, not whole (test_embed_with_path scored 0.05 before)."""
    from agentmemory.testing.embeddings import HashEmbedder

    ours = AgentMemoryStore(
        index={"dims": DIMS, "embed": HashEmbedder(DIMS), "text_fields": ["key1", "key2.subkey"]}
    )
    ours.put(("docs",), "k", {"key1": "xxx", "key2": {"subkey": "yyy"}, "other": "zzz " * 50})
    assert ours.search(("docs",), query="xxx")[0].score > 0.9
    assert ours.search(("docs",), query="yyy")[0].score > 0.9
    one = AgentMemoryStore(index={"dims": DIMS, "embed": HashEmbedder(DIMS), "text_fields": "key1"})
    one.put(("docs",), "k", {"key1": "xxx", "other": "zzz"})
    assert one.search(("docs",), query="xxx")[0].score > 0.9


@pytest.mark.parametrize("distance", ["l2", "inner_product"])
def test_every_distance_of_postgres_store_ranks_alike_and_scores_in_its_own_terms(distance):
    ours, theirs = semantic_pair(distance_type=distance)
    found = ours.search(("docs",), query="a cat on a mat")
    cosine = theirs.search(("docs",), query="a cat on a mat")
    assert [(i.namespace, i.key) for i in found] == [
        (namespace, key) for namespace, key, _ in ranked(cosine)
    ]
    by_key = {i.key: i.score for i in cosine}
    for item in found:
        expected = by_key[item.key]
        if distance == "l2":  # PostgresStore's l2 score: minus the Euclidean distance
            expected = -((2 - 2 * expected) ** 0.5)
        assert item.score == pytest.approx(expected, abs=1e-4)


def test_the_store_exposes_its_embeddings_as_langgraphs_stores_do():
    from langchain_core.embeddings import Embeddings

    ours, _ = semantic_pair()
    assert isinstance(ours.embeddings, Embeddings)
    assert len(ours.embeddings.embed_query("cat")) == DIMS
    assert AgentMemoryStore(MemoryStore(cache=None, index=None)).embeddings is None
