"""PostgreSQL's one-statement write is a function of the database's (``agentmemory_upsert``,
migration 0008); its declared seam ``Defect.UPSERT_SKIPS_HISTORY`` calls a broken copy
(migration 0010) that inserts no history version on an overwrite -- so a bug in the function
itself is shown to be caught, by the suite and by memcheck's self-test."""

from __future__ import annotations

import pytest
from django.db import connection

from agentmemory import MemoryStore
from agentmemory.consistency.selftest import run_self_test
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import Defect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_broken_function_is_called_and_loses_the_history_of_an_overwrite():
    store = MemoryStore(cache=None, defects={Defect.UPSERT_SKIPS_HISTORY})
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    assert store.recall("s", "k").version == 2
    assert [v.version for v in store.history("s", "k")] == [1]  # the planted bug, visible
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'agentmemory_upsert%%'")
        assert sorted(row[0] for row in cursor.fetchall()) == [
            "agentmemory_upsert",
            "agentmemory_upsert_gated",  # a shard's: the gate, then the real one (0016)
            "agentmemory_upsert_selftest_skips_history",
        ]


def test_the_real_function_keeps_every_version():
    store = MemoryStore(cache=None)
    store.remember("s", "k", "a")
    store.remember("s", "k", "b")
    assert [v.version for v in store.history("s", "k")] == [1, 2]


def test_memchecks_self_test_catches_a_bug_in_the_function():
    config = WorkloadConfig(ops=600, workloads=("register", "list"))
    result = run_self_test(
        ["default"], config, faults="none", defects=[Defect.UPSERT_SKIPS_HISTORY]
    )
    real, outcome = result.outcomes
    assert real.passed, real
    assert outcome.applicable and outcome.caught, outcome


# PostgreSQL's checkpoint put is a function too (agentmemory_put_checkpoint, migration 0012); its
# declared seam Defect.PUT_FUNCTION_FORKS calls a copy without the conflict check.


def two_children_of_one_parent(chains) -> list[str]:
    """Two writers that loaded the chain's latest checkpoint, 1, each put a child of it
    (``expect=""``: a put after loading the latest, not a fork asked for from an id)."""
    from agentmemory.checkpoints import NewBlob

    def put(checkpoint_id, parent):
        chains.put(
            "t",
            "",
            checkpoint_id,
            parent,
            expect="",
            checkpoint=("json", b"{}"),
            metadata=("json", b"{}"),
            run_id=None,
            versions={"c": checkpoint_id},
            blobs=[NewBlob("c", checkpoint_id, ("json", b"1"))],
        )

    put("1", None)
    put("2", "1")
    put("3", "1")  # loaded the chain when 1 was the latest
    return [found.checkpoint_id for found in chains.page("t", "", None, None, None, 10)]


def test_the_checkpoint_function_refuses_a_put_from_a_parent_no_longer_latest():
    from agentmemory import CheckpointConflict

    with pytest.raises(CheckpointConflict) as raised:
        two_children_of_one_parent(MemoryStore(cache=None).checkpoints)
    assert (raised.value.parent, raised.value.latest) == ("1", "2")


def test_its_broken_copy_is_called_and_forks_the_chain():
    chains = MemoryStore(cache=None, defects={Defect.PUT_FUNCTION_FORKS}).checkpoints
    assert two_children_of_one_parent(chains) == ["3", "2", "1"]  # 2 and 3: children of 1


def test_memchecks_self_test_catches_a_fork_in_the_checkpoint_function():
    config = WorkloadConfig(ops=600, workloads=("checkpoint",))
    result = run_self_test(["default"], config, faults="none", defects=[Defect.PUT_FUNCTION_FORKS])
    real, outcome = result.outcomes
    assert real.passed, real
    assert outcome.applicable and outcome.caught, outcome
