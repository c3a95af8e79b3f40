"""Statements the server takes: a batch is split into as many statements as it needs (SQLite's
variables, a MySQL-family server's packet size), and one value too large for the server's
packet is refused before it is sent, naming its size and the limit (#42: SQLite refused one
append of 62,500 items with "too many SQL variables" while the docs allow 100,000; MariaDB
answered a value over its 16 MB packet with a raw error 1153, or dropped the connection and
the retries spent 9 s on it; one append of 21 items of 900 KB, each within the limit, failed
the same way)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from agentmemory import InvalidMemory, MemoryStore
from agentmemory.validation import BATCH_MAX
from agentmemory.vendors import packet_limit

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_append_of_the_documented_limit_of_items_is_stored():
    store = MemoryStore(cache=None)
    items = store.append("s", "log", list(range(BATCH_MAX)))
    assert [item.seq for item in items[-2:]] == [BATCH_MAX - 1, BATCH_MAX]
    assert store.log_length("s", "log") == BATCH_MAX
    assert [item.value for item in store.read_log("s", "log", limit=3)] == [
        BATCH_MAX - 3,
        BATCH_MAX - 2,
        BATCH_MAX - 1,
    ]


def test_an_append_larger_than_one_packet_is_split_into_statements():
    store = MemoryStore(cache=None)
    big = ["x" * 900_000 + str(n) for n in range(21)]  # 18.9 MB: over MariaDB's 16 MB packet
    stored = store.append("s", "log", big)
    assert [item.seq for item in stored] == list(range(1, 22))
    assert [item.value for item in store.read_log("s", "log")] == big


def test_a_value_larger_than_the_servers_packet_is_refused_naming_the_limit():
    """On a MySQL-family server: InvalidMemory naming max_allowed_packet, nothing written, no
    retry. Elsewhere no such limit exists, and the value is stored."""
    limit = packet_limit(connection) or 17 * 1024 * 1024
    value = "\\" * (limit // 2)  # each backslash is escaped to two bytes: over the packet
    store = MemoryStore(cache=None)
    with override_settings(AGENTMEMORY={"MAX_VALUE_BYTES": 4 * limit}):
        if connection.vendor != "mysql":
            assert store.remember("s", "k", value).version == 1
            return
        with pytest.raises(InvalidMemory, match=f"max_allowed_packet is {limit} bytes"):
            store.remember("s", "k", value)
        with pytest.raises(InvalidMemory, match=r"items\[1\].*max_allowed_packet"):
            store.append("s", "log", ["fine", value])
    assert store.recall("s", "k") is None and store.read_log("s", "log") == []
    assert sum(store.retries.values()) == 0


def test_the_packet_size_warning_names_the_server_limit():
    from agentmemory.checks import packet_size_warnings

    assert packet_size_warnings("db", 16 * 1024 * 1024, 1024 * 1024) == []
    (warning,) = packet_size_warnings("db", 1024 * 1024, 1024 * 1024)
    assert warning.id == "agentmemory.W008"
    assert "max_allowed_packet" in warning.msg and str(2 * 1024 * 1024 + 65536) in warning.hint


def test_checkpoint_blobs_and_writes_larger_than_one_packet_are_split():
    from langgraph.checkpoint.base import empty_checkpoint

    from agentmemory.integrations.langgraph import AgentMemorySaver

    saver = AgentMemorySaver(MemoryStore(cache=None))
    big = {f"c{n}": "x" * 900_000 for n in range(21)}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = big
    checkpoint["channel_versions"] = {channel: "1" for channel in big}
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {"step": 0}, dict.fromkeys(big, "1"))
    saver.put_writes(stored, list(big.items()), task_id="task")
    loaded = saver.get_tuple(config)
    assert loaded.checkpoint["channel_values"] == big
    assert [value for _task, _channel, value in loaded.pending_writes] == list(big.values())
