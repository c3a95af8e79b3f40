"""``memcheck --report DIR``: the run as a page to look at -- one ``index.html`` that opens from
disk with no network, its plots beside it, and the history (``history.jsonl``, which ``--check``
checks again) beside them.

The page: the run's header (database, nodes, cache, workers, seed, duration, operations, result);
throughput and latency over time per kind of operation, every injected fault a shaded window
labelled with its kind; the checks' table; and for each check that failed its first
:data:`ANOMALIES_SHOWN` anomalies, each with the operations that make it one. Plots by matplotlib;
the page by Django's template engine (an engine of its own: the project's template settings play
no part).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from django.template import Context, Engine

from . import recorded
from .checker import CHECKS, DATABASE_OWN
from .runner import RunResult

#: Anomalies shown per failed check (each with its operations); the rest are counted.
ANOMALIES_SHOWN = 10
#: Kinds of operation plotted (the most frequent); the rest are summed as "other".
KINDS_PLOTTED = 8
TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "agentmemory" / "memcheck"


def write_report(result: RunResult, folder: str | Path) -> Path:
    """Write the report of ``result`` into ``folder`` (created if missing); returns the page."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recorded.save(str(folder / "history.jsonl"), result.history, result.final)
    ops = [op for op in result.history.operations if op.client != "final" and op.completed_at]
    start = min((op.invoked_at for op in ops), default=0.0)
    plots = _plots(ops, start, result.fault_windows, folder)
    found = Counter(a.check for a in result.anomalies)
    checks = [
        {"name": check, "meaning": meaning, "count": found[check], "own": check in DATABASE_OWN}
        for check, meaning in CHECKS.items()
    ]
    failed = defaultdict(list)
    for anomaly in result.anomalies:
        failed[anomaly.check].append(anomaly)
    sections = [
        {
            "check": check,
            "meaning": CHECKS.get(check, ""),
            "count": len(anomalies),
            "anomalies": [_anomaly(a, start) for a in anomalies[:ANOMALIES_SHOWN]],
        }
        for check, anomalies in failed.items()
    ]
    data = result.as_dict()
    page = Engine(dirs=[str(TEMPLATES)], autoescape=True).get_template("report.html")
    html = page.render(
        Context(
            {
                "result": result,
                "data": data,
                "nodes": list(result.nodes) if len(result.nodes) > 1 else [],
                "cache": ", ".join(f"{k} {v}" for k, v in sorted(result.cache_stats.items())),
                "faults": sorted(result.faults_injected.items()),
                "windows": [(kind, a - start, b - start) for kind, a, b in result.fault_windows],
                "plots": plots,
                "checks": checks,
                "sections": sections,
                "shown": ANOMALIES_SHOWN,
                "passed": not result.anomalies,
                "own_only": bool(result.anomalies) and set(found) <= DATABASE_OWN,
            }
        )
    )
    index = folder / "index.html"
    index.write_text(html, encoding="utf-8")
    return index


def _anomaly(anomaly: Any, start: float) -> dict[str, Any]:
    return {
        "session_id": anomaly.session_id,
        "key": anomaly.key,
        "message": anomaly.message,
        "operations": [
            {
                **op,
                "invoked": op["invoked_at"] - start,
                "completed": (op["completed_at"] or op["invoked_at"]) - start,
            }
            for op in anomaly.operations
        ],
    }


def _plots(ops: list, start: float, windows: list, folder: Path) -> list[dict[str, str]]:
    """Throughput and latency over time, per kind, with the fault windows shaded: PNG files in
    ``folder``; [] when matplotlib is missing (the page says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    counts = Counter(op.kind for op in ops)
    kinds = [kind for kind, _ in counts.most_common(KINDS_PLOTTED)]
    duration = max((op.completed_at - start for op in ops), default=1.0) or 1.0
    width = max(0.05, duration / 80)
    bins = int(duration / width) + 1
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for op in ops:
        by_kind[op.kind if op.kind in kinds else "other"].append(op)
    made = []
    for name, title in (
        ("throughput", "operations completed per second"),
        ("latency", "latency (ms)"),
    ):
        figure, axes = plt.subplots(figsize=(11, 3.6), dpi=100)
        for kind, group in sorted(by_kind.items(), key=lambda item: -len(item[1])):
            if name == "throughput":
                series = [0] * bins
                for op in group:
                    series[int((op.completed_at - start) / width)] += 1
                axes.plot(
                    [i * width for i in range(bins)], [n / width for n in series], label=kind, lw=1
                )
            else:
                axes.scatter(
                    [op.completed_at - start for op in group],
                    [max(0.01, (op.completed_at - op.invoked_at) * 1000) for op in group],
                    s=3,
                    label=kind,
                )
        if name == "latency":
            axes.set_yscale("log")
        for number, (kind, began, ended) in enumerate(windows):
            left, right = began - start, max(ended - start, began - start + width / 2)
            axes.axvspan(left, right, color="tab:red", alpha=0.15)
            # Labels on two rows, so that windows close together stay readable.
            axes.text(
                left,
                1.01 + 0.07 * (number % 2),
                kind,
                transform=axes.get_xaxis_transform(),
                fontsize=7,
                va="bottom",
                color="tab:red",
            )
        axes.set_xlabel("seconds since the run began")
        axes.set_ylabel(title)
        axes.set_xlim(0, duration)
        axes.legend(fontsize=7, ncol=4, loc="upper right")
        figure.tight_layout()
        path = folder / f"{name}.png"
        figure.savefig(path)
        plt.close(figure)
        made.append({"file": path.name, "title": title})
    return made
