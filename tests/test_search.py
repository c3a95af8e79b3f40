"""Semantic recall (``MemoryStore.search``): ranking, and the contract's semantic 12 -- every score
comes from the vectors of the version returned; forgotten, expired and erased memories are never
returned; an acknowledged write is seen by every later search -- on every backend, with the Redis
tier on and off."""

from __future__ import annotations

import asyncio
import math
import re
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from agentmemory import EmbeddingFailed, Index, InvalidMemory, MemoryStore, ScoredMemory
from agentmemory.consistency.semantic import expected_score
from agentmemory.defects import Defect
from agentmemory.models import Memory, MemoryVersion
from agentmemory.semantic import MISSING, MODELS_SESSION, VectorCache, vector_cache
from agentmemory.testing.embeddings import HashEmbedder

from .conftest import redis_alias

DIMS = 32
FIELDS = ["text"]

pytestmark = pytest.mark.django_db(transaction=True)


def make(cache: str | None, *, embed=None, fields=FIELDS, timeout=30.0, **kwargs) -> MemoryStore:
    index = Index(embed=embed or HashEmbedder(DIMS), dims=DIMS, fields=fields, timeout=timeout)
    return MemoryStore(cache=cache, index=index, **kwargs)


@pytest.fixture(params=["db", "redis"])
def cache(request) -> str | None:
    return None if request.param == "db" else redis_alias()


@pytest.fixture
def store(cache) -> MemoryStore:
    return make(cache)


def cosine_score(query: str, value) -> float:
    """The score a result must have, worked out without the store (memcheck's checker does the
    same in plain Python): the best cosine similarity of the query's vector to the value's texts'."""
    return expected_score(query, value, dims=DIMS, fields=tuple(FIELDS))


def assert_scores_true(query: str, results: list[ScoredMemory], store: MemoryStore) -> None:
    """Each result: its value is the stored value of the version it names, and its score is
    computed from that value."""
    for result in results:
        stored = MemoryVersion.objects.get(
            memory__session_id=result.session_id, memory__key=result.key, version=result.version
        )
        assert stored.value == result.value, result
        expected = cosine_score(query, result.value)
        assert result.score == pytest.approx(expected, abs=1e-5), (
            f"{result.key} v{result.version} scored {result.score}, its value scores {expected}"
        )


def test_memories_are_ranked_by_meaning(store):
    store.remember("s", "pets", {"text": "the cat sat on the mat"})
    store.remember("s", "park", {"text": "dogs chase a ball in the park"})
    store.remember("s", "physics", {"text": "quantum chromodynamics lecture notes"})
    results = store.search("s", "a cat on a mat")
    assert [r.key for r in results][:1] == ["pets"]
    assert all(isinstance(r, ScoredMemory) for r in results)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    assert_scores_true("a cat on a mat", results, store)
    top = results[0]
    assert (top.session_id, top.version, top.value) == ("s", 1, {"text": "the cat sat on the mat"})


@pytest.mark.parametrize("how", ["remember", "update", "revert", "remember_many"])
def test_a_score_comes_from_the_version_returned_after_every_kind_of_write(store, how):
    store.remember("s", "k", {"text": "apples and pears"})
    store.remember("s", "k", {"text": "rockets and satellites"})
    if how == "remember":
        store.remember("s", "k", {"text": "bread and butter"})
    elif how == "update":
        store.update("s", "k", lambda v: {"text": v["text"] + " and moons"})
    elif how == "revert":
        store.revert("s", "k", 1)
    else:
        store.remember_many("s", {"k": {"text": "bread and butter"}, "j": {"text": "jam"}})
    for query in ("apples", "rockets moons", "bread"):
        results = store.search("s", query, limit=5)
        assert [r.version for r in results if r.key == "k"] == [3]
        assert_scores_true(query, results, store)


def test_the_stale_vector_defect_breaks_the_score_check():
    """The test above fails when an overwrite keeps the vectors of the value it replaces."""
    stale = make(None, defects={Defect.STALE_VECTOR})
    stale.remember("s", "k", {"text": "apples and pears"})
    stale.remember("s", "k", {"text": "rockets and satellites"})
    with pytest.raises(AssertionError, match="scored"):
        assert_scores_true("apples", stale.search("s", "apples"), stale)


def test_forgotten_expired_and_erased_memories_are_never_returned(store, memory_clock):
    store.remember("s", "gone", {"text": "cat"})
    store.remember("s", "short", {"text": "cat"}, ttl=60)
    store.remember("s", "kept", {"text": "cat"})
    store.remember("t", "erased", {"text": "cat"})
    store.forget("s", "gone")
    memory_clock.advance(61)
    store.erase_session("t")
    assert [r.key for r in store.search("s", "cat")] == ["kept"]
    assert store.search("t", "cat") == []
    store.forget_session("s")
    assert store.search("s", "cat") == []
    store.remember("s", "gone", {"text": "a cat again"})
    assert [(r.key, r.version) for r in store.search("s", "cat")] == [("gone", 3)]


def test_a_write_acknowledged_before_a_search_is_seen_by_any_client(cache, concurrently):
    """Writer and searcher are different threads (connections) and stores: every acknowledged
    version is the one the next search returns, whatever the cache holds."""
    writer, reader = make(cache), make(cache)
    for n in range(5):
        text = f"note number {n} about cats"
        concurrently(lambda i, t=text: writer.remember("s", "k", {"text": t}), workers=1)
        reader.recall("s", "k")  # the cache may hold this version: search must not care
        found = concurrently(lambda i: reader.search("s", "cats"), workers=1)[0]
        assert [(r.version, r.value["text"]) for r in found] == [(n + 1, text)]


def test_searches_during_concurrent_overwrites_pair_every_score_with_its_version(
    store, concurrently
):
    """Writers overwrite and forget indexed memories while searchers run: every result's value
    is its version's, and its score that value's."""
    words = ["cat", "dog", "bird", "fish", "horse", "cow"]
    queries: list[tuple[str, list[ScoredMemory]]] = []
    lock = threading.Lock()
    # The searchers start once a memory is stored: on a loaded machine they could otherwise all
    # be done before the first write committed, and search nothing (a CI run).
    written = threading.Event()

    def work(i: int) -> None:
        if not i % 2:
            assert written.wait(60), "no writer stored a memory in 60 s"
        for n in range(25):
            if i % 2:
                key = f"k{n % 3}"
                if n % 7 == 6:
                    store.forget("s", key)
                elif n % 2:
                    store.update("s", key, lambda v, n=n: {"text": f"{words[n % 6]} {n}"})
                else:
                    store.remember("s", key, {"text": f"{words[(n + i) % 6]} and {words[n % 6]}"})
                    written.set()
            else:
                query = words[(n + i) % 6]
                found = store.search("s", query, limit=3)
                with lock:
                    queries.append((query, found))

    concurrently(work, workers=4)
    assert sum(len(found) for _, found in queries) > 0
    for query, found in queries:
        assert_scores_true(query, found, store)


def test_an_embedder_that_fails_fails_the_write_and_nothing_is_written(cache):
    def broken(texts):
        raise ConnectionError("the embedding service is down")

    good = make(cache)
    good.remember("s", "k", {"text": "first"})
    bad = make(cache, embed=broken)
    for write in (
        lambda: bad.remember("s", "k", {"text": "second"}),
        lambda: bad.remember("s", "new", {"text": "second"}),
        lambda: bad.remember_many("s", {"k": {"text": "second"}, "new": {"text": "x"}}),
        lambda: bad.update("s", "k", lambda v: {"text": "second"}),
        lambda: bad.revert("s", "k", 1),
    ):
        with pytest.raises(EmbeddingFailed, match="ConnectionError: the embedding service is down"):
            write()
    assert bad.recall("s", "new") is None
    assert [(v.version, v.value) for v in bad.history("s", "k")] == [(1, {"text": "first"})]
    assert Memory.objects.filter(key="new").count() == 0


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (lambda texts: [[1.0] * (DIMS - 1) for _ in texts], "31 dimensions; the index has dims=32"),
        (lambda texts: [], r"0 vector\(s\)"),
        (lambda texts: [[math.nan] * DIMS for _ in texts], "NaN"),
        (lambda texts: "not vectors", "not a list of vectors"),
    ],
)
def test_an_embedder_answer_that_is_not_one_vector_per_text_fails_the_write(answer, named):
    store = make(None, embed=answer)
    with pytest.raises(EmbeddingFailed, match=named):
        store.remember("s", "k", {"text": "hello"})
    assert Memory.objects.count() == 0


def test_an_embedder_that_does_not_answer_in_time_fails_the_write():
    release = threading.Event()

    def stuck(texts):
        release.wait()  # answers only after the test has seen the timeout
        return [[1.0] * DIMS for _ in texts]

    store = make(None, embed=stuck, timeout=0.05)
    try:
        with pytest.raises(EmbeddingFailed, match=r"did not answer within 0\.05 s"):
            store.remember("s", "k", {"text": "hello"})
    finally:
        release.set()
    assert Memory.objects.count() == 0


def test_index_false_and_other_fields_per_write(store):
    store.remember("s", "plain", {"text": "cat"}, index=False)
    store.remember("s", "title", {"text": "dog", "title": "cat"}, index=["title"])
    store.remember("s", "nothing", {"title": "cat"})  # no "text": nothing to index
    assert [r.key for r in store.search("s", "cat")] == ["title"]
    assert store.recall("s", "plain").value == {"text": "cat"}


def test_several_texts_score_by_the_best_one(cache):
    store = make(cache, fields=["notes[*]"])
    store.remember("s", "k", {"notes": ["quantum physics", "a cat on a mat"]})
    store.remember("s", "j", {"notes": ["cat food", "dog food", "fish food"]})
    (best, second) = store.search("s", "cat on a mat")
    assert (best.key, second.key) == ("k", "j")
    embedder = HashEmbedder(DIMS)
    index = Index(embed=embedder, dims=DIMS, fields=["notes[*]"])
    assert index.texts(best.value) == ["quantum physics", "a cat on a mat"]


def test_search_is_confined_to_its_session_and_search_sessions_to_its_prefix(store):
    for session in ("a", "a%", "a_", "A", "b"):
        store.remember(session, "k", {"text": "cat"})
    assert [r.session_id for r in store.search("a", "cat")] == ["a"]
    assert [r.session_id for r in store.search("a%", "cat")] == ["a%"]
    assert sorted(r.session_id for r in store.search_sessions("a", "cat")) == ["a", "a%", "a_"]
    assert sorted(r.session_id for r in store.search_sessions("", "cat")) == [
        "A",
        "a",
        "a%",
        "a_",
        "b",
    ]


def test_prefix_filter_limit_and_offset(store):
    for n in range(6):
        store.remember("s", f"note-{n}", {"text": "cat " * (n + 1), "n": n, "kind": "note"})
    store.remember("s", "Note-9", {"text": "cat", "n": 9, "kind": "note"})
    store.remember("s", "other", {"text": "cat", "n": 1, "kind": "other"})
    everything = store.search("s", "cat", prefix="note-", limit=100)
    assert sorted(r.key for r in everything) == [f"note-{n}" for n in range(6)]
    pages = [store.search("s", "cat", prefix="note-", limit=2, offset=o) for o in (0, 2, 4)]
    assert [r.key for page in pages for r in page] == [r.key for r in everything]
    assert sorted(r.key for r in store.search("s", "cat", filter={"n": {"$gte": 4}})) == [
        "Note-9",
        "note-4",
        "note-5",
    ]
    assert [r.key for r in store.search("s", "cat", filter={"kind": "other"})] == ["other"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.search("s", ""), "query"),
        (lambda s: s.search("s", "   "), "query"),
        (lambda s: s.search("s", None), "query"),
        (lambda s: s.search("s", "cat", limit=0), "limit"),
        (lambda s: s.search("s", "cat", limit=1001), "limit"),
        (lambda s: s.search("s", "cat", offset=-1), "offset"),
        (lambda s: s.search("s", "cat", prefix="a\x00"), "prefix"),
        (lambda s: s.search("s", "cat", filter={"a b": 1}), "filter"),
        (lambda s: s.search("s", "cat", filter={"n": {"$near": 1}}), "filter"),
        (lambda s: s.search("s", "cat", filter=["n"]), "filter"),
        (lambda s: s.search("", "cat"), "session_id"),
        (lambda s: s.search_sessions("a\n", "cat"), "prefix"),
        (lambda s: s.remember("s", "k", {"text": "x"}, index="text"), "index"),
        (lambda s: s.remember("s", "k", {"text": "x"}, index=["a..b"]), "index"),
    ],
)
def test_bad_search_input_is_refused_naming_the_field(call, field):
    store = make(None)
    with pytest.raises(InvalidMemory) as raised:
        call(store)
    assert raised.value.field == field
    assert Memory.objects.count() == 0


def test_a_store_without_an_index_says_how_to_configure_one():
    with pytest.raises(ImproperlyConfigured, match=r"AGENTMEMORY\['SEARCH'\]"):
        MemoryStore(cache=None, index=None).search("s", "cat")


def test_the_index_comes_from_settings(settings):
    settings.AGENTMEMORY = {
        "SEARCH": {"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "FIELDS": ["t"]}
    }
    store = MemoryStore(cache=None)
    assert store.index is not None and store.index.dims == 64
    store.remember("s", "k", {"t": "hello world"})
    assert [r.key for r in store.search("s", "hello")] == ["k"]


def test_vectors_of_another_configuration_are_not_compared(cache):
    make(cache).remember("s", "k", {"text": "cat"})
    other = MemoryStore(cache=cache, index=Index(embed=HashEmbedder(16), dims=16, fields=FIELDS))
    assert other.search("s", "cat") == []
    other.remember("s", "j", {"text": "cat"})
    assert [r.key for r in other.search("s", "cat")] == ["j"]


def test_a_search_inside_a_transaction_sees_the_transactions_own_writes(store):
    with transaction.atomic():
        store.remember("s", "k", {"text": "uncommitted cat"})
        assert [r.key for r in store.search("s", "cat")] == ["k"]
        transaction.set_rollback(True)
    assert store.search("s", "cat") == []


def test_the_async_twins(store):
    async def main():
        await store.aremember("s", "k", {"text": "cat"})
        return await store.asearch("s", "cat"), await store.asearch_sessions("s", "cat")

    one, many = asyncio.run(main())
    assert [r.key for r in one] == [r.key for r in many] == ["k"]


def test_a_rolled_back_write_never_lends_its_vectors_to_the_next_one(store):
    """Vectors are cached by a random name written with them: a rolled-back write that a search
    saw (and cached) shares no name with the write that later takes its row and version."""
    store.remember("s", "k", {"text": "apples"})
    with transaction.atomic():
        store.remember("s", "k", {"text": "rockets"})
        assert_scores_true("rockets", store.search("s", "rockets"), store)
        transaction.set_rollback(True)
    store.remember("s", "k", {"text": "bread"})
    for query in ("rockets", "bread"):
        assert_scores_true(query, store.search("s", query), store)


def test_without_the_vector_cache_every_search_reads_the_vectors(settings, cache):
    settings.AGENTMEMORY = {
        **settings.AGENTMEMORY,
        "SEARCH": {"EMBED": HashEmbedder(DIMS), "DIMS": DIMS, "FIELDS": FIELDS, "CACHE_MB": 0},
    }
    store = MemoryStore(cache=cache)
    for n in range(30):
        store.remember("s", f"k{n}", {"text": f"cat number {n}"})
    store.update("s", "k3", lambda v: {"text": "dog"})
    for query in ("cat number 7", "dog"):
        found = store.search("s", query, limit=5)
        assert_scores_true(query, found, store)
    assert vector_cache().size == 0


def test_the_vector_cache_keeps_the_most_recently_used_within_its_budget():
    import numpy as np

    one = np.zeros((1, 16), dtype=np.float32)  # 64 bytes + 64 of overhead each
    cache = VectorCache(budget_bytes=3 * 128)
    for name in (1, 2, 3):
        cache.put(name, one)
    cache.get_many([1])  # 1 is used: 2 is now the oldest
    cache.put(4, one)
    assert [v is MISSING for v in cache.get_many([1, 2, 3, 4])] == [False, True, False, False]
    assert cache.size == 3 * 128
    names = np.array([1, 3, 4], dtype=np.int64)
    cache.stack("a", names, names, np.zeros((3, 16), dtype=np.float32))  # 192 bytes: kept
    assert cache.stacked("a") is not None
    big = np.array([1, 2, 3, 4], dtype=np.int64)
    cache.stack("b", big, big, np.zeros((4, 16), dtype=np.float32))  # 256 bytes: over half
    assert cache.stacked("b") is None and cache.stacked("a") is not None


def test_the_kept_matrix_ranks_as_a_cold_cache_after_writes_adds_and_forgets(store):
    """The session's matrix is kept between searches and patched row by row after writes: the
    ranking must be the one a process that never searched before gives."""
    words = ["cat", "dog", "bird", "fish", "horse", "tree", "river"]
    for n in range(40):
        store.remember("s", f"k{n:02d}", {"text": f"{words[n % 7]} {words[(n * 3) % 7]} {n}"})
    ranking = lambda query: [
        (r.key, r.version, round(r.score, 6)) for r in store.search("s", query, limit=15)
    ]
    ranking("cat dog")
    store.remember("s", "k03", {"text": "cat dog cat"})
    store.update("s", "k07", lambda v: {"text": "dog bird"})
    store.forget("s", "k11")
    store.remember("s", "new", {"text": "cat cat dog"})
    for query in ("cat dog", "bird", "river tree"):
        warm = ranking(query)
        vector_cache().clear()
        assert warm == ranking(query), query


def test_a_write_through_a_store_without_an_index_unindexes_never_leaves_old_vectors(store):
    store.remember("s", "k", {"text": "cat"})
    MemoryStore(cache=None, index=None).remember("s", "k", {"text": "dog"})
    assert store.search("s", "cat") == [] and store.search("s", "dog") == []
    store.remember("s", "k", {"text": "dog"})
    assert [r.version for r in store.search("s", "dog")] == [3]


def test_a_process_that_only_writes_keeps_no_vectors(store):
    cache = vector_cache()
    cache.clear()
    cache.searched = False
    store.remember("s", "k", {"text": "cat"})
    assert cache.size == 0
    store.search("s", "cat")
    store.remember("s", "k", {"text": "dog"})
    assert cache.size > 0


def test_the_search_ignores_expiry_defect_returns_an_expired_memory(memory_clock):
    """The expiry assertion above fails on a search that filters by state only."""
    broken = make(None, defects={Defect.SEARCH_IGNORES_EXPIRY})
    broken.remember("s", "short", {"text": "cat"}, ttl=60)
    memory_clock.advance(61)
    assert broken.recall("s", "short") is None
    assert [r.key for r in broken.search("s", "cat")] == ["short"]


def test_a_value_with_more_texts_than_the_limit_is_refused_before_anything_is_written(cache):
    from agentmemory.validation import INDEX_TEXTS_MAX

    store = make(cache, fields=["items[*]"])
    too_many = {"items": ["a"] * (INDEX_TEXTS_MAX + 1)}
    for call in (
        lambda: store.remember("s", "k", too_many),
        lambda: store.remember_many("s", {"k": too_many}),
        lambda: store.update("s", "k", lambda _old: too_many),
        lambda: store.remember("s", "k", {"other": ["a"] * 70_000}, index=["other[*]"]),
    ):
        with pytest.raises(InvalidMemory, match=f"over the limit of {INDEX_TEXTS_MAX}") as error:
            call()
        assert error.value.field == "index"
    # Nothing of the memory's (the index's model registered itself: agentmemory.semantic).
    assert not Memory.objects.exclude(session_id=MODELS_SESSION).exists()
    assert not MemoryVersion.objects.exclude(memory__session_id=MODELS_SESSION).exists()
    assert store.remember("s", "k", {"items": ["a"] * INDEX_TEXTS_MAX}).version == 1


@pytest.mark.parametrize(
    ("spelled", "plain"), [("$.text", "text"), ("$.notes[*].body", "notes[*].body")]
)
def test_jsonpath_spelling_of_a_field_indexes_the_same_texts(cache, spelled, plain):
    value = {"text": "the cat sat on the mat", "notes": [{"body": "the cat sat on the mat"}]}
    plain_store, spelled_store = make(cache, fields=[plain]), make(cache, fields=[spelled])
    plain_store.remember("plain", "k", value)
    spelled_store.remember("spelled", "k", value)
    spelled_store.remember("spelled", "per-call", value, index=[spelled])
    found = spelled_store.search("spelled", "a cat on a mat")
    assert [r.key for r in found] and all(r.score > 0.5 for r in found)
    assert found[0].score == pytest.approx(plain_store.search("plain", "a cat on a mat")[0].score)


def test_system_check_and_write_path_agree_on_jsonpath_fields(settings):
    from agentmemory.checks import check_settings

    settings.AGENTMEMORY = {
        "SEARCH": {"EMBED": HashEmbedder(DIMS), "DIMS": DIMS, "FIELDS": ["$.text", "$..deep"]}
    }
    errors = [e for e in check_settings(None) if e.id == "agentmemory.E019"]
    assert len(errors) == 1 and "'$..deep'" in errors[0].msg and "'$.text'" not in errors[0].msg


# ------------------------------------------------------------------ the model's fingerprint


class OtherModel(HashEmbedder):
    """Another embedding model of the same dimensions: each word lands elsewhere."""

    def vector(self, text):
        return super().vector(" ".join(f"other-{word}" for word in text.split()))


def index_of_model(model, embed=None, fields=FIELDS):
    return Index(embed=embed or HashEmbedder(DIMS), dims=DIMS, fields=fields, model=model)


def test_a_search_never_compares_the_vectors_of_another_model(cache):
    first = MemoryStore(cache=cache, index=index_of_model("model-a"))
    second = MemoryStore(cache=cache, index=index_of_model("model-b", OtherModel(DIMS)))
    first.remember("s", "by-a", {"text": "the cat sat on the mat"})
    second.remember("s", "by-b", {"text": "the cat sat on the mat"})
    assert [r.key for r in first.search("s", "cat on a mat")] == ["by-a"]
    assert [r.key for r in second.search("s", "cat on a mat")] == ["by-b"]


def test_an_embedder_changed_under_the_same_model_name_is_refused_before_any_write(cache):
    MemoryStore(cache=cache, index=index_of_model("same-name")).remember(
        "s", "k", {"text": "the cat sat on the mat"}
    )
    changed = MemoryStore(cache=cache, index=index_of_model("same-name", OtherModel(DIMS)))
    for call in (
        lambda: changed.remember("s", "k2", {"text": "a dog"}),
        lambda: changed.update("s", "k", lambda _old: {"text": "a dog"}),
        lambda: changed.search("s", "cat"),
    ):
        with pytest.raises(EmbeddingFailed, match=r"manage\.py reindex"):
            call()
    assert [h.version for h in MemoryStore(cache=None).history("s", "k")] == [1]
    assert MemoryStore(cache=None).recall("s", "k2") is None


def reindex(settings, model, embed="agentmemory.testing.embeddings.embed", *args):
    from io import StringIO

    from django.core.management import call_command

    settings.AGENTMEMORY = {
        **settings.AGENTMEMORY,
        "SEARCH": {"EMBED": embed, "DIMS": 64, "FIELDS": ["text"], "MODEL": model},
    }
    out, err = StringIO(), StringIO()
    call_command("reindex", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_reindex_embeds_another_models_memories_again_in_place_and_resumably(settings):
    from agentmemory.testing.embeddings import DIMS as DEFAULT_DIMS

    old = MemoryStore(
        cache=None,
        index=Index(
            embed=OtherModel(DEFAULT_DIMS), dims=DEFAULT_DIMS, fields=["text"], model="old"
        ),
    )
    old.remember("s", "pets", {"text": "the cat sat on the mat"})
    old.remember("s", "titled", {"text": "physics notes", "title": "cat mat"}, index=["title"])
    old.remember("s", "park", {"text": "dogs chase a ball in the park"})
    out, _ = reindex(settings, "new", "agentmemory.testing.embeddings.embed", "--dry-run")
    assert "would embed again 3 memories" in out
    new = MemoryStore(cache=None)
    assert new.search("s", "a cat on a mat") == []  # nothing of the new model yet
    out, err = reindex(settings, "new", "agentmemory.testing.embeddings.embed", "--batch", "2")
    assert "embedded again 3 memories" in out and "3/3 memories" in err
    found = new.search("s", "a cat on a mat")
    # "titled" by its own paths (its title, as it was indexed), "pets" by the index's "text".
    assert {r.key for r in found[:2]} == {"pets", "titled"}
    for result in found:
        paths = ("title",) if result.key == "titled" else ("text",)
        expected = expected_score("a cat on a mat", result.value, dims=DEFAULT_DIMS, fields=paths)
        assert result.score == pytest.approx(expected, abs=1e-5)
    assert all(len(new.history("s", key)) == 1 for key in ("pets", "titled", "park"))  # in place
    out, _ = reindex(settings, "new", "agentmemory.testing.embeddings.embed")
    assert "embedded again 0 memories" in out  # resumable: what is done stays done


def test_reindex_never_overwrites_a_write_made_meanwhile(settings):
    """The memory is written again (by the old model's store) between the reindex's read and
    its update: the update finds another version and leaves the write's own vectors."""
    import threading

    from django.db import connection

    from agentmemory.semantic import model_of
    from agentmemory.testing.embeddings import DIMS as DEFAULT_DIMS

    old_index = Index(
        embed=OtherModel(DEFAULT_DIMS), dims=DEFAULT_DIMS, fields=["text"], model="old"
    )
    old = MemoryStore(cache=None, index=old_index)
    old.remember("s", "k", {"text": "the cat sat on the mat"})
    raced = []

    def write_first(execute, sql, params, many, context):
        # The reindex's own UPDATE (the ORM quotes its columns; the write path's do not).
        if re.search(r'SET [`"]embedding[`"] = ', sql) and not raced:
            thread = threading.Thread(
                target=lambda: raced.append(old.remember("s", "k", {"text": "a new value"}))
            )
            thread.start()
            thread.join()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(write_first):
        out, _ = reindex(settings, "new")
    assert "embedded again 0 memories" in out and raced[0].version == 2
    row = Memory.objects.get(session_id="s", key="k")
    assert row.value == {"text": "a new value"} and model_of(row.embedding) == old_index.tag


def test_vectors_written_before_fingerprints_are_compared_as_before_until_reindexed(settings):
    """Vectors in the format before 0.6 (no fingerprint) are any model's of their dims."""
    import struct

    from agentmemory.semantic import model_of, unpack

    store = MemoryStore(cache=None, index=index_of_model("model-a"))
    store.remember("s", "k", {"text": "the cat sat on the mat"})
    row = Memory.objects.get(session_id="s", key="k")
    matrix = unpack(row.embedding)
    legacy = struct.pack("<HH", DIMS, len(matrix)) + matrix.astype("<f4").tobytes()
    Memory.objects.filter(id=row.id).update(embedding=legacy, embedding_key=12345)
    assert model_of(legacy) is None
    other = MemoryStore(cache=None, index=index_of_model("model-b"))
    assert [r.key for r in other.search("s", "a cat on a mat")] == ["k"]
    assert other.reindex() == 1
    assert model_of(Memory.objects.get(id=row.id).embedding) == other.index.tag


def test_reindex_without_an_index_or_on_an_unknown_database_exits_2(settings):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SEARCH": None}
    with pytest.raises(CommandError, match="no semantic index") as error:
        call_command("reindex")
    assert error.value.returncode == 2
    with pytest.raises(CommandError, match="unknown database alias 'nope'") as error:
        call_command("reindex", "--database", "nope")
    assert error.value.returncode == 2
