"""OpenTelemetry (#47, items 1, 2 and 6): each store call a span with the database's
attributes and agentmemory's, ids as keyed hashes; the metrics of a conflict, a retry, a replay
and the Redis tier's events -- read with the SDK's in-memory exporter and metric reader, through
the declared seam ``agentmemory.telemetry.configure``."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmemory import MemoryStore, VersionConflict, telemetry

from .conftest import redis_alias
from .helpers import inject_errors
from .test_retries import conflict_error

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def otel():
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry.configure(tracer_provider, MeterProvider(metric_readers=[reader]))
    try:
        yield spans, reader, tracer_provider
    finally:
        telemetry.configure()


def points(reader) -> dict[str, list]:
    """Each metric's data points, by name."""
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_each_call_is_a_span_with_its_attributes_and_hashed_ids(otel):
    spans, reader, _ = otel
    store = MemoryStore(cache=None)
    store.remember("user-42", "tone", "warm")
    store.recall("user-42", "tone")
    store.append("user-42", "chat", ["hi"])
    names = [span.name for span in spans.get_finished_spans()]
    assert names == ["agentmemory.remember", "agentmemory.recall", "agentmemory.append"]
    remember, recall, append = spans.get_finished_spans()
    assert remember.attributes["db.operation.name"] == "remember"
    assert remember.attributes["db.namespace"] == "default"
    assert remember.attributes["agentmemory.version"] == 1
    assert remember.attributes["agentmemory.session_id.hash"] == telemetry.keyed_hash("user-42")
    assert "agentmemory.session_id" not in remember.attributes
    assert "user-42" not in str(dict(remember.attributes)) and "tone" not in str(
        dict(remember.attributes)
    )
    assert recall.attributes["agentmemory.read.source"] == "database"
    assert append.attributes["agentmemory.count"] == 1
    durations = points(reader)["agentmemory.operation.duration"]
    assert {p.attributes["db.operation.name"] for p in durations} == {
        "remember",
        "recall",
        "append",
    }


def test_raw_ids_only_when_the_setting_allows_them(otel, settings):
    spans, _, _ = otel
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "TELEMETRY_RAW_IDS": True}
    MemoryStore(cache=None).remember("user-42", "tone", "warm")
    (span,) = spans.get_finished_spans()
    assert span.attributes["agentmemory.session_id"] == "user-42"
    assert span.attributes["agentmemory.key"] == "tone"


def test_a_conflict_a_replay_and_a_retry_are_counted(otel):
    spans, reader, _ = otel
    store = MemoryStore(cache=None)
    store.remember("s", "k", 1, idempotency_key="r")
    store.remember("s", "k", 1, idempotency_key="r")
    with pytest.raises(VersionConflict):
        store.remember("s", "k", 2, expected_version=0)
    with inject_errors(conflict_error, when=lambda n, sql: n == 1):
        store.remember("s", "k", 3)
    found = points(reader)
    assert sum(p.value for p in found["agentmemory.conflicts"]) == 1
    assert sum(p.value for p in found["agentmemory.replays"]) == 1
    (retry,) = found["agentmemory.retries"]
    assert retry.value == 1 and retry.attributes["agentmemory.cause"]
    outcomes = {
        p.attributes["agentmemory.outcome"] for p in found["agentmemory.operation.duration"]
    }
    assert outcomes == {"ok", "conflict"}
    conflicted = [s for s in spans.get_finished_spans() if s.attributes.get("agentmemory.conflict")]
    assert len(conflicted) == 1 and conflicted[0].status.status_code.name == "ERROR"


def test_the_redis_tiers_events_are_counted(otel, settings):
    _, reader, _ = otel
    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k", 1)
    store.recall("s", "k")
    store.recall("s", "k")
    events = {
        p.attributes["agentmemory.event"]: p.value
        for p in points(reader)["agentmemory.cache.events"]
    }
    assert events.get("hits", 0) >= 1 and events.get("updates", 0) >= 1, events


def test_the_async_twins_spans_are_children_of_the_callers(otel):
    spans, _, tracer_provider = otel
    tracer = tracer_provider.get_tracer("the agent")

    async def main() -> None:
        with tracer.start_as_current_span("the agent's turn"):
            await MemoryStore(cache=None).aremember("s", "k", 1)

    asyncio.run(main())
    child, parent = spans.get_finished_spans()
    assert child.name == "agentmemory.remember" and child.parent.span_id == parent.context.span_id


def test_nothing_is_recorded_when_turned_off_or_not_configured(otel, settings):
    spans, reader, _ = otel
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "OPENTELEMETRY": False}
    MemoryStore(cache=None).remember("s", "k", 1)
    assert spans.get_finished_spans() == () and not points(reader)
    telemetry.configure()  # back to the global providers: none is set in the suite
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "OPENTELEMETRY": True}
    MemoryStore(cache=None).remember("s", "k", 2)
    assert spans.get_finished_spans() == () and not points(reader)


def test_a_memcheck_run_is_one_trace_with_its_anomalies_as_events(otel):
    """memcheck writes its run as one trace: a root span, a child per operation with the
    history's times; an unsafe run's anomalies are events on the operations of their
    counterexamples (#47, item 5)."""
    from agentmemory.consistency.runner import run_memcheck
    from agentmemory.consistency.workloads import WorkloadConfig

    spans, _, _ = otel
    config = WorkloadConfig(ops=200, workers=4, workloads=("register",))
    result = run_memcheck("default", config, unsafe=True)
    assert result.anomalies
    mine = [s for s in spans.get_finished_spans() if s.name.startswith("memcheck")]
    (root,) = [s for s in mine if s.name == f"memcheck {result.run_id}"]
    children = [s for s in mine if s is not root]
    assert len(children) == len([o for o in result.history.operations if o.completed_at])
    assert {s.context.trace_id for s in mine} == {root.context.trace_id}
    assert all(s.parent.span_id == root.context.span_id for s in children)
    assert root.attributes["agentmemory.memcheck.anomalies"] == len(result.anomalies)
    assert root.status.status_code.name == "ERROR"
    flagged = [s for s in children if any(e.name == "anomaly" for e in s.events)]
    assert flagged, "no operation span carries its anomaly"
    assert all(s.start_time <= s.end_time for s in children)


def test_the_checkpointers_calls_are_spans_with_the_thread_hashed(otel):
    """A LangGraph step's calls -- put, put_writes, get_tuple, list -- are each a span
    ``agentmemory.checkpoint.<operation>``, the thread id a keyed hash."""
    from langgraph.checkpoint.base import empty_checkpoint

    from agentmemory.integrations.langgraph import AgentMemorySaver

    spans, reader, _ = otel
    saver = AgentMemorySaver(MemoryStore(cache=None))
    config = {"configurable": {"thread_id": "user-42", "checkpoint_ns": ""}}
    stored = saver.put(config, empty_checkpoint(), {"step": 0}, {})
    saver.put_writes(stored, [("messages", "hi")], "task-1")
    assert saver.get_tuple(config) is not None
    assert len(list(saver.list(config))) == 1
    names = [span.name for span in spans.get_finished_spans()]
    assert names == [
        "agentmemory.checkpoint.put",
        "agentmemory.checkpoint.put_writes",
        "agentmemory.checkpoint.get_tuple",
        "agentmemory.checkpoint.list",
    ], names
    for span in spans.get_finished_spans():
        assert span.attributes["agentmemory.thread_id.hash"] == telemetry.keyed_hash("user-42")
        assert "user-42" not in str(dict(span.attributes))
    assert spans.get_finished_spans()[-1].attributes["agentmemory.count"] == 1
    durations = points(reader)["agentmemory.operation.duration"]
    assert {p.attributes["db.operation.name"] for p in durations} >= {"checkpoint.put"}


def test_the_pending_invalidations_are_a_gauge_until_a_renewal_replays_them(otel):
    """A writer that cannot reach Redis records its key as pending: the gauge counts it (and the
    oldest one's age) when the reader collects; once a reader renews the fence, replaying it,
    the gauge is back to 0."""
    from agentmemory.defects import cut_off_next_write

    _, reader, _ = otel

    def gauges() -> tuple[float, float]:
        found = points(reader)
        (count,) = found["agentmemory.cache.pending_invalidations"]
        (age,) = found["agentmemory.cache.pending_invalidations.oldest_age"]
        assert count.attributes["db.namespace"] == "default"
        return count.value, age.value

    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k", 1)
    assert gauges() == (0, 0)
    cut = cut_off_next_write(lambda session_id, _keys: session_id == "s")
    store.remember("s", "k", 2)  # recorded as pending; the writer waits out the fence
    assert cut.reached.is_set()
    count, age = gauges()
    assert count == 1 and age > 0  # one key (its two records: before and after the commit)
    store.cache.client.delete(store.cache.fence_key)  # the next read renews, replaying first
    assert store.recall("s", "k").version == 2
    assert gauges() == (0, 0)


def test_ids_are_hashed_under_a_key_of_the_process_without_a_secret_key(otel, settings):
    """agentmemory.setup() outside a project has no SECRET_KEY (Django refuses to read an empty
    one): the store's calls still run, their ids hashed under a random key of the process."""
    spans, _, _ = otel
    settings.SECRET_KEY = ""
    store = MemoryStore(cache=None)
    store.remember("user-42", "tone", "warm")
    store.recall("user-42", "tone")
    first, second = (
        s.attributes["agentmemory.session_id.hash"] for s in spans.get_finished_spans()
    )
    assert first == second and len(first) == 16
    unkeyed = telemetry.hmac.new(b"agentmemory", b"user-42", "sha256").hexdigest()[:16]
    assert first != unkeyed  # not a constant key anyone could hash candidate ids with


@pytest.mark.slow
def test_the_docs_trace_picture_is_drawn_from_a_real_turn(tmp_path):
    """scripts/trace_picture.py (docs/observability.md's picture): a plain script, no project --
    agentmemory.setup, the LangGraph saver and the store under the SDK's exporter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "trace.png"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    script = Path(__file__).resolve().parent.parent / "scripts" / "trace_picture.py"
    done = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    names = done.stdout.splitlines()[:-1]
    assert names[0] == "agent turn (user-42)"
    assert names.count("agentmemory.remember") == 2  # the conflict, then the retry
    assert {"agentmemory.checkpoint.put", "agentmemory.checkpoint.put_writes"} <= set(names)
    assert out.read_bytes().startswith(b"\x89PNG")
