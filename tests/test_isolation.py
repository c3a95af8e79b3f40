"""Semantic 5: nothing done with session A reads, counts, changes or deletes anything of session B."""

import pytest
from django.db import IntegrityError, connection, transaction

from agentmemory import clock
from agentmemory.models import Memory, MemoryVersion

pytestmark = pytest.mark.django_db

LOOK_ALIKES = [
    "a",
    "a%",
    "a_",
    "A",
    "a ",
    " a",
    "a'",
    'a"',
    "a\\",
    "á",
    "a%_",
    "%",
    "_",
    "\uff41",
]  # the last: FULLWIDTH a


@pytest.fixture
def populated(store):
    for session_id in LOOK_ALIKES:
        store.remember_many(
            session_id, {"k": session_id, "k%": session_id, "K": session_id, "k_x": session_id}
        )
    return store


def test_each_look_alike_session_reads_only_its_own(populated):
    for session_id in LOOK_ALIKES:
        found = populated.recall_many(session_id)
        assert {r.value for r in found.values()} == {session_id}, session_id
        assert set(found) == {"k", "k%", "K", "k_x"}


def test_prefix_search_treats_wildcards_literally(populated):
    assert set(populated.recall_many("a", prefix="k%")) == {"k%"}
    assert set(populated.recall_many("a", prefix="k_")) == {"k_x"}
    assert set(populated.recall_many("a", prefix="k")) == {"k", "k%", "k_x"}
    assert set(populated.recall_many("a", prefix="")) == {"k", "k%", "K", "k_x"}


def test_forget_session_touches_only_its_own(populated):
    assert populated.forget_session("a") == 4
    assert populated.recall_many("a") == {}
    for session_id in LOOK_ALIKES[1:]:
        assert len(populated.recall_many(session_id)) == 4, session_id


def test_erase_session_touches_only_its_own(populated):
    assert populated.erase_session("a_") == 4
    assert populated.history("a_", "k") == []
    for session_id in set(LOOK_ALIKES) - {"a_"}:
        assert len(populated.history(session_id, "k")) == 1, session_id


def test_versions_are_counted_per_session(populated):
    populated.remember("a", "k", "again")
    assert populated.recall("a", "k").version == 2
    assert populated.recall("a%", "k").version == 1
    assert populated.recall("A", "k").version == 1


def test_purge_expired_in_one_session_leaves_others(store):
    store.remember("a", "k", 1, ttl=1)
    store.remember("a_", "k", 2)
    clock.advance(2)
    assert store.purge_expired() == 1
    assert store.recall("a_", "k").value == 2


def test_erasure_does_not_depend_on_what_was_stored(store, vendor):
    """A value that no reader could decode any more (written before the depth limit, or by hand)
    must not stop a data-erasure request."""
    store.remember("erase-me", "k", 1)
    store.remember("keep", "k", 1)
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    planted = None
    # 12,000 levels: deeper than any Python decodes (3.13 decodes 2,000, refuses 10,000) and
    # within what PostgreSQL parses (it refuses 20,000 at its default max_stack_depth). SQLite's
    # JSON check stops at 2,000 levels (undecodable up to Python 3.12); MariaDB's at 31.
    for depth in (12_000, 2_000):
        deep = "[" * depth + "]" * depth
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                for model in (Memory, MemoryVersion):
                    column = "session_id" if model is Memory else "memory_id"
                    cursor.execute(
                        f"UPDATE {model._meta.db_table} SET value = %s{cast} WHERE {column} IN "
                        f"(SELECT id FROM {Memory._meta.db_table} WHERE session_id = %s)"
                        if model is MemoryVersion
                        else f"UPDATE {model._meta.db_table} SET value = %s{cast} WHERE {column} = %s",
                        [deep, "erase-me"],
                    )
        except IntegrityError:  # the database's own JSON check refuses it
            continue
        planted = depth
        break
    if planted is None:
        assert vendor == "mariadb"
    elif planted == 12_000:
        with pytest.raises(RecursionError):
            store.history("erase-me", "k")
    assert store.erase_session("erase-me") == 1
    assert not Memory.objects.filter(session_id="erase-me").exists()
    assert not MemoryVersion.objects.filter(memory__session_id="erase-me").exists()
    assert store.recall("keep", "k").version == 1
