"""The checkpoint chains' storage (agentmemory.checkpoints) by the plans of its statements: a read
of a chain costs the same at any length -- the head found first, the ``(thread, checkpoint_id)``
index walked from its end -- on every database. What the saver makes of it is tested in
tests/test_langgraph_checkpointer.py and by LangGraph's own suite."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentmemory.checkpoints import (
    WHOLE_READS,
    _get_statement,
    _page_statement,
    _statements,
    _whole_statement,
)
from agentmemory.models import Checkpoint, CheckpointBlob, CheckpointThread

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


def chain_of(thread: str, length: int, channels: int, changed: int) -> None:
    """A chain of ``length`` checkpoints of ``channels`` channels, ``changed`` of them new at
    each step after the first (a blob each), with a pending write per checkpoint."""
    from agentmemory import MemoryStore
    from agentmemory.checkpoints import NewBlob

    chains = MemoryStore(cache=None).checkpoints
    versions = {f"ch{c}": "0" for c in range(channels)}
    parent = None
    for n in range(length):
        new = list(versions) if n == 0 else [f"ch{(n + c) % channels}" for c in range(changed)]
        for channel in new:
            versions[channel] = str(n)
        chains.put(
            thread,
            "",
            f"{n:06d}",
            parent,
            expect=None,
            checkpoint=("json", b"{}"),
            metadata=("json", b"{}"),
            run_id=None,
            versions=dict(versions),
            blobs=[NewBlob(c, versions[c], ("json", f'"{c}@{n}"'.encode())) for c in new],
        )
        chains.put_writes(thread, "", f"{n:06d}", "task", "", [(0, "ch0", ("json", b"1"))])
        parent = f"{n:06d}"


def test_a_read_is_one_statement_of_one_text_whatever_the_channels():
    """``get`` and ``page`` on PostgreSQL and SQLite: one statement, the same text for a thread
    of 2 channels and one of 12 -- planned once, cached by the driver (a branch per blob made
    a ``list(10)`` of 10 channels 110 branches, planned on every call). The MySQL family: the
    checkpoints, then their blobs and writes, in statements that grow with them."""
    from agentmemory import MemoryStore

    chains = MemoryStore(cache=None).checkpoints
    texts = []
    for thread, channels in (("narrow", 2), ("wide", 12)):
        chain_of(thread, 12, channels, 2)
        for read in (
            lambda: chains.get(thread, "", None),  # noqa: B023
            lambda: chains.page(thread, "", None, None, None, 10),  # noqa: B023
        ):
            with CaptureQueriesContext(connection) as queries:
                found = read()
            assert found
            texts.append([q["sql"] for q in queries.captured_queries])
    if connection.vendor not in WHOLE_READS:
        # The blobs' branches: a statement per hundred keys (120 blobs of the wide page: two).
        assert [len(t) for t in texts] == [2, 2, 2, 3], texts
    else:
        assert [len(t) for t in texts] == [1] * 4, texts

        # Parameters are printed into the logged SQL: compare the statements' shapes.
        def shape(text: str) -> str:
            return text.replace("narrow", "wide")

        assert shape(texts[0][0]) == shape(texts[2][0])
        assert shape(texts[1][0]) == shape(texts[3][0])


def test_a_put_is_one_round_trip_on_postgresql_whatever_the_channels():
    """``put`` (new, then the same id again) and ``put_writes`` (plain and special writes): on
    PostgreSQL one statement each, a call of its function that commits by itself (migration
    0012; it was BEGIN, the head's lock, the probe, the blobs, the insert, COMMIT). Elsewhere one
    transaction whose statements do not grow with the channels."""
    from agentmemory import MemoryStore
    from agentmemory.checkpoints import NewBlob

    chains = MemoryStore(cache=None).checkpoints
    calls = {}
    for channels in (2, 12):
        thread, texts = f"t{channels}", []
        for n, parent in ((0, None), (1, "000000"), (1, "000000")):
            with CaptureQueriesContext(connection) as queries:
                chains.put(
                    thread,
                    "",
                    f"{n:06d}",
                    parent,
                    expect=parent,
                    checkpoint=("json", b"{}"),
                    metadata=("json", b"{}"),
                    run_id=None,
                    versions={f"c{c}": str(n) for c in range(channels)},
                    blobs=[NewBlob(f"c{c}", str(n), ("json", b"1")) for c in range(channels)],
                )
            texts.append([q["sql"] for q in queries.captured_queries])
        writes = [(i, f"c{i}", ("json", b"1")) for i in range(channels)]
        with CaptureQueriesContext(connection) as queries:
            chains.put_writes(thread, "", "000001", "task", "", [*writes, (-1, "e", ("j", b""))])
        texts.append([q["sql"] for q in queries.captured_queries])
        calls[channels] = [
            [t for t in statements if "max_allowed_packet" not in t]  # once per connection
            for statements in texts
        ]
        assert len(chains.get(thread, "", None).writes) == channels + 1
    if connection.vendor == "postgresql":
        for statements in calls[2] + calls[12]:
            assert len(statements) == 1, statements
            assert statements[0].startswith("SELECT agentmemory_put_")
    else:
        assert [len(s) for s in calls[2]] == [len(s) for s in calls[12]]
        for statements in calls[2] + calls[12]:
            assert statements[0].startswith("BEGIN") and statements[-1] == "COMMIT"


def test_a_page_looks_each_blob_up_on_a_table_grown_past_its_statistics():
    """The blobs of a page of 10 checkpoints of 6 channels -- in a thread of 300 checkpoints
    that wrote 1,800 blobs, never analyzed -- are read by one index lookup each: about 60 blob
    rows, never every blob of the thread per checkpoint (PostgreSQL hashed them all when the
    blobs were joined). The MySQL family sends the blobs' keys, a branch each: each branch
    must be one lookup too."""
    chain_of("t", 300, 6, 6)
    head = CheckpointThread.objects.get(thread_id="t").pk
    assert CheckpointBlob.objects.filter(thread_id=head).count() == 1800
    if connection.vendor not in WHOLE_READS:
        from agentmemory import MemoryStore

        with CaptureQueriesContext(connection) as queries:
            assert len(MemoryStore(cache=None).checkpoints.page("t", "", None, None, None, 10))
        table = CheckpointBlob._meta.db_table
        sent = [q["sql"] for q in queries.captured_queries if table in q["sql"]]
        # Each statement as sent, its values in it (MySQLdb interpolates on the client): the
        # plan of each access to the blobs.
        accesses = []
        with connection.cursor() as cursor:
            for sql in sent:
                cursor.execute("EXPLAIN FORMAT=JSON " + sql, None)
                accesses += [
                    node for node in plan_nodes(cursor.fetchone()[0]) if node["table_name"] == table
                ]
        assert len(accesses) == 60, accesses  # a page of 10 checkpoints x 6 channels, each new
        for node in accesses:  # one row by the unique index, all three of its columns
            assert node["access_type"] in ("const", "eq_ref"), node
            assert node["key"] == "agentmemory_one_blob_per_version", node
        return
    statement = _whole_statement(
        connection.vendor,
        _page_statement(connection.vendor, True, True, False, False, False),
        False,
    )
    read = rows_examined(statement, ["t", "", 10], CheckpointBlob._meta.db_table, "b", loops=True)
    assert read is None or read <= 60, f"{read} blob rows read for 60 blobs"
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + statement, ["t", "", 10])
            plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
        assert "(thread_id=? AND channel=? AND version=?)" in plan, plan


def plan_nodes(text: str) -> list[dict]:
    """Every table access of a MySQL-family ``EXPLAIN FORMAT=JSON``."""
    import json

    found = []

    def walk(node):
        if isinstance(node, dict):
            if "table_name" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(text))
    return found


def test_two_special_writes_of_one_index_in_one_call_keep_the_last():
    """Two interrupts of one task in one ``put_writes`` (index -3 both): the last is kept, as
    PostgresSaver's upsert per write keeps it. PostgreSQL refused the call before ("ON CONFLICT
    DO UPDATE command cannot affect row a second time"); a plain index keeps its first."""
    from agentmemory import MemoryStore

    chains = MemoryStore(cache=None).checkpoints
    chain_of("t", 1, 1, 1)
    writes = [(-3, "__interrupt__", ("json", b"1")), (-3, "__interrupt__", ("json", b"2"))]
    writes += [(0, "a", ("json", b"first")), (0, "a", ("json", b"second"))]
    chains.put_writes("t", "", "000000", "other", "", writes)
    found = chains.get("t", "", None)
    kept = {(w.task_id, w.idx): w.value for w in found.writes}
    assert kept[("other", -3)] == ("json", b"2")
    assert kept[("other", 0)] == ("json", b"first")
