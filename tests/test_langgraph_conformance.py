"""LangGraph's own test suite for checkpointers (``langgraph-checkpoint-conformance``), run in full
against :class:`AgentMemorySaver` on the backend under test: every capability it knows, base and
optional, must be detected and pass -- through the asynchronous methods (which the suite calls)
and through the synchronous ones (each called on a thread of its own, as LangGraph's sync graphs
call them from their workers) -- and on a ShardedStore over the suite's two databases (its
threads spread over both: listings of every thread merged, copies between shards)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from agentmemory import ShardedStore, aio
from agentmemory.integrations.langgraph import AgentMemorySaver

pytestmark = pytest.mark.django_db(transaction=True)


class SyncMethods(AgentMemorySaver):
    """The suite's asynchronous calls answered by the synchronous methods, each call on a new
    thread: the suite then checks ``get_tuple``, ``list``, ``put``, ... themselves."""

    async def aget_tuple(self, config):
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config, **kwargs) -> AsyncIterator[Any]:
        for found in await asyncio.to_thread(lambda: list(self.list(config, **kwargs))):
            yield found

    async def aput(self, config, checkpoint, metadata, new_versions):
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id):
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids):
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id, target_thread_id):
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids, *, strategy="keep_latest"):
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


@checkpointer_test(name="AgentMemorySaver")
async def async_saver():
    yield AgentMemorySaver()


@checkpointer_test(name="AgentMemorySaver (sync methods)")
async def sync_saver():
    yield SyncMethods()


SHARDS = ["default", "other"]


@checkpointer_test(name="AgentMemorySaver on two shards")
async def sharded_saver():
    yield AgentMemorySaver(ShardedStore(SHARDS, cache=None))


@checkpointer_test(name="AgentMemorySaver (sync methods) on two shards")
async def sharded_sync_saver():
    yield SyncMethods(ShardedStore(SHARDS, cache=None))


@pytest.fixture(autouse=True)
def _close_pool_connections():
    yield
    aio.close_connections()  # the test database is dropped after the run


@pytest.mark.parametrize("registered", [async_saver, sync_saver], ids=["async", "sync"])
def test_langgraphs_conformance_suite_passes_every_capability(registered):
    passes_in_full(registered)


@pytest.mark.django_db(transaction=True, databases=SHARDS)
@pytest.mark.parametrize("registered", [sharded_saver, sharded_sync_saver], ids=["async", "sync"])
def test_the_suite_passes_on_a_saver_over_two_shards(registered):
    passes_in_full(registered)


def passes_in_full(registered):
    report = asyncio.run(validate(registered, progress=ProgressCallbacks.quiet()))
    results = report.results
    assert set(results) == {capability.value for capability in ALL_CAPABILITIES}
    failed = {
        name: result.failures
        for name, result in results.items()
        if not (result.detected and result.passed and result.tests_failed == 0)
    }
    assert not failed, failed
    passed = sum(result.tests_passed for result in results.values())
    assert passed >= 58 and report.conformance_level() == "FULL", report.to_dict()
