"""A memcheck run as OpenTelemetry spans, when OpenTelemetry is configured
(:mod:`agentmemory.telemetry`): one trace per run -- its root span ``memcheck <run id>`` from the
first operation to the last, each operation a child span with its own times, client, status and
version, and each anomaly an event on the operations of its counterexample (and on the root), so
that a failing run can be looked at in Jaeger or Tempo beside the application's own traces.

The spans are written from the run's history once it is checked: their times are the ones the
history recorded (the store's own spans of the run's calls, if any, are traces of their own)."""

from __future__ import annotations

from typing import Any

from .. import telemetry


def export(result: Any) -> bool:
    """Write ``result``'s run as one trace; False (nothing written) when OpenTelemetry is not
    configured or the run has no operation."""
    tracer = telemetry.tracer()
    operations = [op for op in result.history.operations if op.completed_at is not None]
    if tracer is None or not operations:
        return False
    from opentelemetry import trace

    started = min(op.invoked_at for op in operations)
    ended = max(op.completed_at for op in operations)
    flagged: dict[str, list[Any]] = {}
    for anomaly in result.anomalies:
        for op in anomaly.operations:
            flagged.setdefault(op.get("id"), []).append(anomaly)
    root = tracer.start_span(
        f"memcheck {result.run_id}",
        start_time=_ns(started),
        attributes={
            "agentmemory.memcheck.run_id": result.run_id,
            "agentmemory.memcheck.database": result.database,
            "agentmemory.memcheck.vendor": result.vendor,
            "agentmemory.memcheck.faults": result.faults,
            "agentmemory.memcheck.operations": len(operations),
            "agentmemory.memcheck.anomalies": len(result.anomalies),
        },
    )
    context = trace.set_span_in_context(root)
    for op in operations:
        attributes = {
            "agentmemory.memcheck.op": op.id,
            "agentmemory.memcheck.client": op.client,
            "agentmemory.memcheck.status": str(op.status),
            "agentmemory.session_id.hash": telemetry.keyed_hash(op.session_id),
            "agentmemory.key.hash": telemetry.keyed_hash(op.key),
        }
        if op.version is not None:
            attributes["agentmemory.version"] = op.version
        if op.error:
            attributes["agentmemory.memcheck.error"] = op.error[:300]
        span = tracer.start_span(
            f"memcheck.{op.kind}",
            context=context,
            start_time=_ns(op.invoked_at),
            attributes=attributes,
        )
        for anomaly in flagged.get(op.id, []):
            span.add_event("anomaly", _event(anomaly))
        span.end(end_time=_ns(op.completed_at))
    for anomaly in result.anomalies:
        root.add_event("anomaly", _event(anomaly))
    if result.anomalies:
        root.set_status(trace.Status(trace.StatusCode.ERROR, f"{len(result.anomalies)} anomalies"))
    root.end(end_time=_ns(ended))
    return True


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _event(anomaly: Any) -> dict[str, str]:
    return {"agentmemory.memcheck.check": anomaly.check, "message": anomaly.message[:500]}
