"""Semantic 11: what was acknowledged survives closing every connection and a new process."""

import pytest
from django.db import connections

from agentmemory import MemoryStore

from .helpers import run_processes

pytestmark = pytest.mark.django_db(transaction=True)


def _recall(session_id, key):
    record = MemoryStore(cache=None).recall(session_id, key)
    return None if record is None else (record.version, record.value)


@pytest.mark.slow
def test_acknowledged_writes_survive_closing_connections_and_a_new_process(store):
    store.remember("s", "k", {"kept": True})
    store.remember("s", "k", {"kept": "twice"})
    connections.close_all()
    assert run_processes(_recall, [("s", "k")]) == [(2, {"kept": "twice"})]
