"""Semantic 1: versions 1, 2, 3, ... with no gap and no reuse, across forget, expiry and revert."""

import asyncio

import pytest

from agentmemory import InvalidMemory, clock

pytestmark = pytest.mark.django_db


def ops_of(store, session_id="s", key="k"):
    return [(h.version, h.op) for h in store.history(session_id, key)]


def test_each_write_is_the_next_version(store):
    versions = [store.remember("s", "k", i).version for i in range(5)]
    assert versions == [1, 2, 3, 4, 5]
    assert ops_of(store) == [(v, "write") for v in versions]


def test_forget_is_a_version_and_the_next_write_continues_the_count(store):
    store.remember("s", "k", "a")
    assert store.forget("s", "k") is True
    assert store.recall("s", "k") is None
    assert store.remember("s", "k", "b").version == 3
    assert ops_of(store) == [(1, "write"), (2, "forget"), (3, "write")]


def test_expiry_is_a_version_and_the_next_write_continues_the_count(store):
    store.remember("s", "k", "a", ttl=10)
    clock.advance(11)
    assert store.remember("s", "k", "b").version == 3
    assert ops_of(store) == [(1, "write"), (2, "expire"), (3, "write")]


def test_revert_writes_a_new_version_holding_the_old_value(store):
    store.remember("s", "k", {"v": 1})
    store.remember("s", "k", {"v": 2})
    reverted = store.revert("s", "k", 1)
    assert (reverted.version, reverted.value) == (3, {"v": 1})
    assert store.recall("s", "k").value == {"v": 1}
    assert ops_of(store) == [(1, "write"), (2, "write"), (3, "revert")]


def test_revert_after_forget_brings_the_memory_back_as_the_next_version(store):
    store.remember("s", "k", "a")
    store.forget("s", "k")
    assert store.revert("s", "k", 1).version == 3
    assert store.recall("s", "k").value == "a"


def test_history_is_oldest_first_with_values(store):
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    store.forget("s", "k")
    history = store.history("s", "k")
    assert [(h.version, h.op, h.value) for h in history] == [
        (1, "write", "a"),
        (2, "write", "b"),
        (3, "forget", None),
    ]


def test_history_of_unknown_key_is_empty(store):
    assert store.history("s", "never") == []


def test_recall_of_an_old_version(store):
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    assert store.recall("s", "k", version=1).value == "a"
    assert store.recall("s", "k", version=2).value == "b"
    assert store.recall("s", "k", version=3) is None


def test_recall_of_a_forget_version_is_none(store):
    store.remember("s", "k", "a")
    store.forget("s", "k")
    assert store.recall("s", "k", version=2) is None


def test_failed_write_leaves_no_version(store):
    store.remember("s", "k", "a")

    def boom(_value):
        raise RuntimeError("agent code failed")

    with pytest.raises(RuntimeError):
        store.update("s", "k", boom)
    assert ops_of(store) == [(1, "write")]
    assert store.remember("s", "k", "b").version == 2


def history_pages(
    store, session_id: str, key: str, *, limit: int, versions: int
) -> list[list[int]]:
    """Every page of the history, newest first, each after the last version of the one before;
    fails at once -- naming the page -- when a page holds a version not below its bound (the
    next bound would not move: endless paging) or there are more pages than ``versions`` can
    fill."""
    pages: list[list[int]] = []
    before = None
    for _ in range(versions // limit + 2):
        page = [
            h.version for h in store.history(session_id, key, limit=limit, before_version=before)
        ]
        if not page:
            return pages
        assert before is None or max(page) < before, (
            f"the page before v{before} holds {page}: a version not below its bound"
        )
        assert page == sorted(page, reverse=True) and len(set(page)) == len(page), page
        pages.append(page)
        before = page[-1]
    raise AssertionError(f"more than {versions // limit + 1} pages of {limit}: {pages}")


def test_history_pages_newest_first_by_version_and_covers_everything_once(store):
    for i in range(25):
        store.remember("s", "k", i)
    store.forget("s", "k")
    pages = history_pages(store, "s", "k", limit=10, versions=26)
    assert pages == [list(range(26, 16, -1)), list(range(16, 6, -1)), list(range(6, 0, -1))]
    assert [h.version for h in store.history("s", "k")] == list(range(1, 27))  # unchanged
    first = store.history("s", "k", limit=1)[0]
    assert (first.version, first.op) == (26, "forget")


def test_a_history_page_is_not_shifted_by_versions_written_meanwhile(store):
    for i in range(5):
        store.remember("s", "k", i)
    page = store.history("s", "k", limit=2)
    for i in range(3):
        store.remember("s", "k", f"new {i}")  # v6..v8 arrive while the reader pages
    following = store.history("s", "k", limit=2, before_version=page[-1].version)
    assert [h.version for h in page + following] == [5, 4, 3, 2]
    assert len(store.history("s", "k", before_version=3)) == 2  # a page of up to 100


@pytest.mark.parametrize("before", [10, 11, 12, 20, 2**62])
def test_a_page_before_a_version_past_the_newest_is_the_newest_page(store, before):
    for i in range(9):
        store.remember("s", "k", i)
    page = store.history("s", "k", limit=5, before_version=before)
    assert [h.version for h in page] == [9, 8, 7, 6, 5]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"before_version": 0}, "before_version"),
        ({"limit": 5, "before_version": "x"}, "before_version"),
    ],
)
def test_bad_history_pages_are_refused(store, arguments, field):
    store.remember("s", "k", 1)
    with pytest.raises(InvalidMemory) as error:
        store.history("s", "k", **arguments)
    assert error.value.field == field


@pytest.mark.django_db(transaction=True)
def test_history_pages_have_an_async_twin(store):
    for i in range(3):
        store.remember("s", "k", i)

    async def main():
        return await store.ahistory("s", "k", limit=2)

    assert [h.version for h in asyncio.run(main())] == [3, 2]
