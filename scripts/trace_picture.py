"""The picture of a trace in docs/observability.md: one agent turn -- a LangGraph step on the
checkpointer, the memory read and written with compare-and-set (one conflict, retried), the
conversation's log -- recorded by OpenTelemetry's SDK with an in-memory exporter, and drawn as a
trace viewer draws it (a bar per span, children under their parent, conflicts in red).

    .venv/bin/python scripts/trace_picture.py [OUT.png]    # default docs/observability-trace.png

No Django project: ``agentmemory.setup`` on a throw-away SQLite file. Needs matplotlib and
opentelemetry-sdk (``pip install ".[report,otel]" opentelemetry-sdk``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def record_a_turn(folder: Path) -> list[Any]:
    """The finished spans of one agent turn, in the order they started."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import agentmemory
    from agentmemory import VersionConflict, telemetry

    store = agentmemory.setup(f"sqlite:///{folder / 'memory.db'}")
    from langgraph.checkpoint.base import empty_checkpoint

    from agentmemory.integrations.langgraph import AgentMemorySaver

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(provider)
    saver = AgentMemorySaver(store)
    config = {"configurable": {"thread_id": "user-42", "checkpoint_ns": ""}}
    store.remember("user-42", "preferences", {"tone": "warm"})
    stale = store.recall("user-42", "preferences")
    store.update("user-42", "preferences", lambda v: {**v, "language": "fr"})  # another turn
    exporter.clear()
    agent = provider.get_tracer("my-agent")
    with agent.start_as_current_span("agent turn (user-42)"):
        saver.get_tuple(config)
        store.read_log("user-42", "chat", limit=20)
        with agent.start_as_current_span("model call"):
            pass  # the LLM: what the agent waits on, not the memory
        try:
            store.remember(
                "user-42", "preferences", {"tone": "brief"}, expected_version=stale.version
            )
        except VersionConflict:
            latest = store.recall("user-42", "preferences")
            store.remember(
                "user-42",
                "preferences",
                {**latest.value, "tone": "brief"},
                expected_version=latest.version,
            )
        stored = saver.put(config, empty_checkpoint(), {"source": "loop", "step": 1}, {})
        saver.put_writes(stored, [("messages", "noted")], "task-1")
        store.append("user-42", "chat", [{"role": "assistant", "content": "Noted."}])
    telemetry.configure()
    return sorted(exporter.get_finished_spans(), key=lambda span: span.start_time)


def draw(spans: list[Any], out: Path) -> None:
    """A waterfall of ``spans``: one row each, indented under its parent, its bar from start to
    end in milliseconds since the first; red where the span's status is ERROR."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(span.start_time for span in spans)
    depth: dict[int, int] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        depth[span.context.span_id] = depth.get(parent, -1) + 1 if parent in depth else 0
    figure, axes = plt.subplots(figsize=(10, 0.42 * len(spans) + 1.2))
    for row, span in enumerate(spans):
        left = (span.start_time - start) / 1e6
        width = max((span.end_time - span.start_time) / 1e6, 0.05)
        failed = span.status.status_code.name == "ERROR"
        mine = span.name.startswith("agentmemory.")
        color = "#c62828" if failed else "#1565c0" if mine else "#78909c"
        axes.barh(row, width, left=left, color=color, height=0.6)
        details = [
            f"{name.removeprefix('agentmemory.')}={span.attributes[name]}"
            for name in ("agentmemory.version", "agentmemory.read.source", "agentmemory.conflict")
            if name in span.attributes
        ]
        level = depth[span.context.span_id]
        label = "    " * max(level - 1, 0) + ("└ " if level else "") + span.name
        axes.text(-0.62, row, label, ha="left", va="center", fontsize=9, family="monospace",
                  transform=axes.get_yaxis_transform())  # fmt: skip
        if details:
            axes.text(left + width, row, "  " + ", ".join(details), va="center", fontsize=8)
    axes.set_yticks([])
    axes.invert_yaxis()
    axes.set_xlabel("milliseconds since the turn began")
    axes.set_title("One agent turn's trace: the agent's spans (grey), agentmemory's (blue), a "
                   "conflict (red)", fontsize=10)  # fmt: skip
    figure.subplots_adjust(left=0.38, right=0.84)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "observability-trace.png"
    with tempfile.TemporaryDirectory() as folder:
        spans = record_a_turn(Path(folder))
    draw(spans, out)
    for span in spans:
        print(span.name)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
