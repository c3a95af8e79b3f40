"""The checkpoint chains' storage (agentmemory.checkpoints) by the plans of its statements: a read
of a chain costs the same at any length -- the head found first, the ``(thread, checkpoint_id)``
index walked from its end -- on every database. What the saver makes of it is tested in
tests/test_langgraph_checkpointer.py and by LangGraph's own suite."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from agentmemory.checkpoints import _get_statement, _page_statement, _statements
from agentmemory.models import Checkpoint, CheckpointThread

from .helpers import analyze, rows_examined

pytestmark = pytest.mark.django_db(transaction=True)

LENGTH = 3000


@pytest.fixture
def long_chain() -> list[str]:
    """A chain of 3,000 checkpoints beside another chain of the same thread and another
    thread's (their rows in the same index), with the server's statistics up to date; the ids
    of the long one, oldest first."""
    ids = fill()
    with connection.cursor() as cursor:
        analyze(cursor, Checkpoint)
    return ids


def fill() -> list[str]:
    now = timezone.now()
    ids = [f"1f1f0000-0000-6000-8000-{n:012d}" for n in range(LENGTH)]
    for thread, ns, count in (("t", "", LENGTH), ("t", "child:1", 50), ("other", "", 500)):
        head = CheckpointThread.objects.create(
            thread_id=thread, checkpoint_ns=ns, created_at=now, updated_at=now
        )
        Checkpoint.objects.bulk_create(
            [
                Checkpoint(
                    thread=head,
                    checkpoint_id=checkpoint_id,
                    type="msgpack",
                    checkpoint=b"",
                    metadata_type="msgpack",
                    metadata=b"",
                    created_at=now,
                )
                for checkpoint_id in ids[:count]
            ],
            batch_size=500,
        )
    return ids


def checkpoints_read(statement: str, params: list) -> int | None:
    return rows_examined(statement, params, Checkpoint._meta.db_table, "c")


def test_the_latest_checkpoint_is_read_from_the_end_of_the_index(long_chain):
    statement = _get_statement(connection.vendor, by_id=False)
    read = checkpoints_read(statement, ["t", ""])
    assert read is None or read <= 2, f"{read} checkpoint rows read for the latest one"


@pytest.mark.parametrize("where", ["latest", "before"])
def test_a_page_of_a_chain_reads_its_checkpoints_only_whatever_the_chain_length(long_chain, where):
    """A page of 10 reads about 10 checkpoint rows of a chain of 3,000 -- never the whole chain
    and a sort (what a join of the head and the checkpoints made PostgreSQL do)."""
    before = where == "before"
    statement = _page_statement(connection.vendor, True, True, False, before, False)
    bound = [long_chain[1500]] if before else []
    read = checkpoints_read(statement, ["t", "", *bound, 10])
    assert read is None or 10 <= read <= 11, f"{read} checkpoint rows read for a page of 10"


def test_a_put_finds_the_latest_checkpoint_from_the_end_of_the_index():
    """The compare-and-set of a put reads one row for the chain's latest checkpoint, even on a
    table grown since its last ANALYZE (here: never analyzed), where PostgreSQL aggregated the
    whole chain for MAX(checkpoint_id)."""
    long_chain = fill()
    head = CheckpointThread.objects.get(thread_id="t", checkpoint_ns="").pk
    statement = _statements(connection.vendor).probe
    read = checkpoints_read(statement, [head, long_chain[10], head])
    assert read is None or read <= 2, f"{read} checkpoint rows read by a put's probe"


def test_a_page_of_many_checkpoints_with_many_channels_reads_every_blob_and_write():
    """A page of 100 checkpoints of 6 channels each: 600 blobs and 100 checkpoints' writes,
    read a hundred keys a statement (SQLite refuses a compound SELECT of more than 500)."""
    from agentmemory import MemoryStore
    from agentmemory.checkpoints import NewBlob

    chains = MemoryStore(cache=None).checkpoints
    parent = None
    for n in range(120):
        checkpoint_id = f"{n:06d}"
        versions = {f"ch{c}": f"{n}.{c}" for c in range(6)}
        chains.put(
            "wide",
            "",
            checkpoint_id,
            parent,
            expect=None,
            checkpoint=("json", b"{}"),
            metadata=("json", b"{}"),
            run_id=None,
            versions=versions,
            blobs=[NewBlob(ch, v, ("json", f'"{v}"'.encode())) for ch, v in versions.items()],
        )
        chains.put_writes("wide", "", checkpoint_id, "task", "", [(0, "ch0", ("json", b"1"))])
        parent = checkpoint_id
    page = chains.page("wide", "", None, None, None, 100)
    assert len(page) == 100
    for found in page:
        n = int(found.checkpoint_id)
        assert found.blobs == {f"ch{c}": ("json", f'"{n}.{c}"'.encode()) for c in range(6)}
        assert [w.task_id for w in found.writes] == ["task"]
