"""What OpenTelemetry costs the store: ``remember`` and ``recall`` (SQLite; and from the Redis
tier where Redis runs) through the method as written (what a project without opentelemetry-api
runs: the store is not wrapped then), wrapped with no provider set, and wrapped with an SDK
provider, its in-memory span exporter and a metric reader -- interleaved, in one run; and the
SDK's own cost of a span and a histogram record without the store (the floor).

    .venv/bin/python bench/telemetry.py           # docs/telemetry-benchmarks.{json,md}
    .venv/bin/python bench/telemetry.py --quick   # seconds, into out/
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from agentmemory import MemoryStore, telemetry  # noqa: E402
from bench.run import available_backends, progress, redis_available, run_header, write_results  # noqa: E402

SIZES = {"full": {"calls": 3000, "repeats": 5}, "quick": {"calls": 200, "repeats": 1}}


def sdk_floor(calls: int) -> float:
    """Microseconds per call of what the OpenTelemetry SDK itself costs a call of ours, without
    the store: a CLIENT span with the same attributes made current and ended (a simple processor,
    an in-memory exporter), and a histogram record -- the floor no instrumented call goes under."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = tracer_provider.get_tracer("floor")
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("floor")
    histogram = meter.create_histogram("floor.duration", unit="s")
    attributes = {
        "db.system.name": "sqlite",
        "db.operation.name": "recall",
        "db.namespace": "sqlite",
        "agentmemory.session_id.hash": "0123456789abcdef",
        "agentmemory.key.hash": "0123456789abcdef",
    }

    def call() -> None:
        with tracer.start_as_current_span(
            "agentmemory.recall", kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            span.set_attributes({"agentmemory.version": 1, "agentmemory.read.source": "cache"})
        histogram.record(0.0001, {"db.operation.name": "recall", "agentmemory.outcome": "ok"})

    return 1e6 / rate(calls, call)


def configured() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    telemetry.configure(tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))


def rate(calls: int, call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return calls / (time.perf_counter() - started)


def measure(store: MemoryStore, mode: str, calls: int) -> dict[str, float]:
    session = f"bench-{uuid.uuid4().hex[:8]}"
    if mode == "with an in-memory exporter":
        configured()
    try:
        if mode == "not wrapped (no opentelemetry-api)":
            remember = lambda: MemoryStore.remember.__wrapped__(store, session, "k", 1)
            recall = lambda: MemoryStore.recall.__wrapped__(store, session, "k")
        else:
            remember = lambda: store.remember(session, "k", 1)
            recall = lambda: store.recall(session, "k")
        figures = {"remember": rate(calls, remember), "recall": rate(calls, recall)}
    finally:
        telemetry.configure()
    store.erase_session(session)
    return figures


MODES = (
    "not wrapped (no opentelemetry-api)",
    "wrapped, no provider set",
    "with an in-memory exporter",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    size = SIZES["quick" if args.quick else "full"]
    available_backends(["sqlite"])
    stores = {"sqlite": MemoryStore(using="sqlite", cache=None)}
    if redis_available():
        stores["sqlite + Redis tier"] = MemoryStore(using="sqlite", cache="agentmemory")
    results: dict[str, Any] = run_header(
        calls=size["calls"],
        repeats=size["repeats"],
        figures={},
    )
    floors = []
    for where, store in stores.items():
        progress(f"telemetry's cost on {where}")
        samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
        for _ in range(size["repeats"]):
            for mode in MODES:
                for op, value in measure(store, mode, size["calls"]).items():
                    samples[mode].setdefault(op, []).append(value)
            floors.append(sdk_floor(size["calls"]))
        results["figures"][where] = {
            mode: {op: statistics.median(v) for op, v in ops.items()}
            for mode, ops in samples.items()
        }
    results["sdk_floor_us"] = statistics.median(floors)
    write_results("telemetry-benchmarks", results, render, args.quick)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# What OpenTelemetry costs the store",
        "",
        "Written by `bench/telemetry.py` (`make bench`). Sequential calls, calls/s, and in "
        "parentheses the ratio to the unwrapped method in the same run (1.00: no cost).",
        "",
        f"Measured {results['when']} on {results['machine']}: {results['calls']} calls per "
        f"figure, median of {results['repeats']}.",
        "",
        "| store | telemetry | remember | recall |",
        "|---|---|---|---|",
    ]
    for where, modes in results["figures"].items():
        base = modes[MODES[0]]
        for mode, figures in modes.items():
            cells = [
                f"{figures[op]:,.0f}"
                + ("" if mode == MODES[0] else f" ({figures[op] / base[op]:.2f})")
                for op in ("remember", "recall")
            ]
            lines.append(f"| {where} | {mode} | " + " | ".join(cells) + " |")
    floor = results.get("sdk_floor_us")
    if floor is not None:
        lines += [
            "",
            "What the in-memory exporter adds to a call, in microseconds, beside the floor: the "
            "OpenTelemetry SDK's own span (the same attributes, made current, ended into the "
            f"exporter) and histogram record without the store, **{floor:.0f} µs** a call in this "
            "run. A 10 % budget is out of reach wherever a call is faster than ten floors; what "
            "is agentmemory's own is the difference.",
            "",
            "| store | call | added (µs) | of which the SDK's floor | agentmemory's own |",
            "|---|---|---|---|---|",
        ]
        for where, modes in results["figures"].items():
            base, traced = modes[MODES[0]], modes[MODES[2]]
            for op in ("remember", "recall"):
                added = 1e6 / traced[op] - 1e6 / base[op]
                lines.append(
                    f"| {where} | {op} | {added:.0f} | {floor:.0f} | {added - floor:.0f} |"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
