"""``memcheck --report DIR``: the run as a page to look at -- one ``index.html`` that opens from
disk with no network, its plots beside it, and the history (``history.jsonl``, which ``--check``
checks again) beside them.

The page: the run's header (database, nodes, cache, workers, seed, duration, operations, result);
throughput and latency over time per kind of operation (and throughput per node on a cluster),
every injected fault a shaded window labelled with its kind; the checks' table; and for each check that failed its first
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
    keyed = result.history.by_key()
    sections = []
    for check, anomalies in failed.items():
        shown = []
        for number, anomaly in enumerate(anomalies[:ANOMALIES_SHOWN]):
            entry = _anomaly(anomaly, start)
            if plots:
                entry["timeline"] = _timeline(
                    anomaly,
                    keyed.get((anomaly.session_id, anomaly.key), []),
                    result.fault_windows,
                    start,
                    folder / f"anomaly-{check}-{number + 1}.png",
                )
            shown.append(entry)
        sections.append(
            {
                "check": check,
                "meaning": CHECKS.get(check, ""),
                "count": len(anomalies),
                "anomalies": shown,
            }
        )
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
    by_node: dict[str, list[Any]] = defaultdict(list)
    for op in ops:
        by_node[op.node or "?"].append(op)
    charts = [("throughput", "operations completed per second"), ("latency", "latency (ms)")]
    if len(by_node) > 1:  # a cluster: each node's throughput too
        charts.append(("nodes", "operations completed per second, per node"))
    for name, title in charts:
        figure, axes = plt.subplots(figsize=(11, 3.6), dpi=100)
        groups = by_node if name == "nodes" else by_kind
        for kind, group in sorted(groups.items(), key=lambda item: -len(item[1])):
            if name in ("throughput", "nodes"):
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


#: Seconds of the key's history drawn on each side of an anomaly's operations.
TIMELINE_MARGIN = 0.3
#: Kinds drawn as writes besides the history's write kinds (WRITE_KINDS).
WRITING = frozenset(
    {
        "forget",
        "erase",
        "log-append",
        "log-retry",
        "log-pop",
        "log-clear",
        "cp-put",
        "cp-fork",
        "cp-writes",
        "cp-delete",
    }
)
#: Most operations drawn on one timeline (the ones nearest the anomaly's).
TIMELINE_OPS = 60


def _timeline(anomaly: Any, ops: list, windows: list, start: float, path: Path) -> str | None:
    """A picture of the key's operations around ``anomaly``: a row per client, a bar per call
    from invocation to completion (writes, reads, failed and unknown calls told apart), each
    labelled with the version it wrote or read, the fault windows shaded, and the anomaly's own
    operations outlined in red. Returns the file's name (None: nothing to draw)."""
    import matplotlib.pyplot as plt

    involved = {op["id"] for op in anomaly.operations}
    times = [
        t
        for op in anomaly.operations
        for t in (op["invoked_at"], op["completed_at"] or op["invoked_at"])
    ]
    if not times:
        return None
    low, high = min(times) - TIMELINE_MARGIN, max(times) + TIMELINE_MARGIN
    near = [op for op in ops if (op.completed_at or op.invoked_at) >= low and op.invoked_at <= high]
    near.sort(key=lambda op: (op.id not in involved, abs(op.invoked_at - min(times))))
    near = sorted(near[:TIMELINE_OPS], key=lambda op: op.invoked_at)
    if not near:
        return None
    clients = sorted({op.client for op in near})
    row = {client: number for number, client in enumerate(clients)}
    figure, axes = plt.subplots(figsize=(11, 0.5 + 0.45 * len(clients)), dpi=100)
    for kind, began, ended in windows:
        if ended >= low and began <= high:
            axes.axvspan(began - start, ended - start, color="tab:red", alpha=0.12)
            axes.text(began - start, len(clients) - 0.4, kind, fontsize=7, color="tab:red")
    for op in near:
        ended = op.completed_at or high
        color = (
            "#9e9e9e"
            if op.status != "ok"
            else "#1565c0"
            if op.is_write or op.kind in WRITING
            else "#2e7d32"
        )
        mine = op.id in involved
        axes.barh(
            row[op.client],
            max(ended - op.invoked_at, 0.0005),
            left=op.invoked_at - start,
            height=0.6,
            color=color,
            edgecolor="#b71c1c" if mine else color,
            linewidth=2.5 if mine else 0.5,
        )
        label = op.kind + (f" v{op.version}" if op.version is not None else "")
        if op.kind == "cas" and op.expected_version is not None:
            label += f" (expected v{op.expected_version})"
        if op.status != "ok":
            label += f" ({op.status})"
        axes.text(
            max(op.invoked_at, low) - start,
            row[op.client] + 0.36,
            label,
            fontsize=6.5,
            clip_on=True,
        )
    axes.set_yticks(range(len(clients)), clients, fontsize=7)
    axes.set_xlim(low - start, high - start)
    axes.set_ylim(-0.6, len(clients) - 0.1)
    axes.set_xlabel(
        "seconds since the run began (blue: writes, green: reads, grey: failed or "
        "unknown; outlined in red: the anomaly's operations)",
        fontsize=8,
    )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path.name


def write_self_test_report(result: Any, folder: str | Path) -> Path:
    """The self-test as a page (``memcheck --self-test --report DIR``): each variant -- the real
    store first -- with what it breaks, its verdict, its runs, which checks caught it and the
    first anomaly they found."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    page = Engine(dirs=[str(TEMPLATES)], autoescape=True).get_template("self_test.html")
    index = folder / "index.html"
    # A Counter answers any key (0), so the template gets its checks as a list.
    rows = [(outcome, outcome.caught.most_common()) for outcome in result.outcomes]
    index.write_text(page.render(Context({"result": result, "rows": rows})), encoding="utf-8")
    return index
