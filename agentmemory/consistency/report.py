"""memcheck's report: a readable text table, JSON for machines, JUnit XML for CI."""

from __future__ import annotations

import json
import socket
from collections import Counter
from datetime import UTC, datetime
from xml.etree import ElementTree

from .checker import CHECKS, DATABASE_OWN
from .history import allowed_without_answer
from .runner import RunResult
from .selftest import REAL, SelfTestResult

EXAMPLES_PER_CHECK = 3
#: Anomalies listed in the body of a JUnit failure (each check's first ones).
JUNIT_ANOMALIES = 20


def render_json(result: RunResult) -> str:
    return json.dumps(result.as_dict(), indent=2, default=str)


def render_text(result: RunResult) -> str:
    data = result.as_dict()
    mode = "UNSAFE (unlocked read-then-write)" if result.unsafe else "locked write path"
    lines = [
        f"memcheck run {result.run_id} on {result.vendor} (database {result.database!r}), {mode}",
        f"  {data['operations']} calls by {result.config.workers} workers in {data['seconds']}s "
        f"({data['ops_per_second']} calls/s)"
        + (
            f", for {result.config.ops} workload steps (--ops counts steps; a step makes one or "
            "more calls: a retry sends its write again, a checkpoint step reads, then puts)"
            if result.config.ops
            else ""
        ),
        f"  retries absorbed by the store: {result.retries or 'none'}",
        f"  cache tier: {', '.join(f'{k} {v}' for k, v in sorted(result.cache_stats.items())) or 'off'}",
        f"  faults ({result.faults}): "
        + (
            ", ".join(f"{k} {v}" for k, v in sorted(result.faults_injected.items()))
            or ("none injected" if result.faults != "none" else "off")
        )
        + (f"; {len(result.fault_errors)} could not be injected" if result.fault_errors else ""),
        *(
            [f"  cache faults ran on {result.redis}; the project's Redis was not touched"]
            if result.redis
            else []
        ),
        "",
        f"  {'operation':<10} {'ok':>7} {'fail':>7} {'info':>7} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8}",
    ]
    latencies = result.latencies
    for kind, counts in sorted(result.counts.items()):
        lat = latencies.get(kind, {})
        lines.append(
            f"  {kind:<10} {counts['ok']:>7} {counts['fail']:>7} {counts['info']:>7} "
            + " ".join(f"{lat.get(q, 0):>8.1f}" for q in ("p50", "p95", "p99", "max"))
        )
    lines.append(
        "  (ok: answered; fail: refused as the contract says -- a conflict, bad input --, nothing "
        "written; info: no answer, its outcome unknown to the caller)"
    )
    nodes = result.nodes
    if len(nodes) > 1:
        lines += [
            "",
            f"  {'node':<10} {'ok':>7} {'fail':>7} {'info':>7} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'p99 ms':>8} {'max ms':>8}",
        ]
        for node, entry in nodes.items():
            lat = entry["latency_ms"]
            lines.append(
                f"  {node:<10} {entry['ok']:>7} {entry['fail']:>7} {entry['info']:>7} "
                + " ".join(f"{lat.get(q, 0):>8.1f}" for q in ("p50", "p95", "p99", "max"))
            )
    for error in result.fault_errors[:5]:
        lines.append(f"  fault not injected: {error}")
    for failover in result.final.failovers:
        if not failover.injected:
            old, new = (int(t, 16) for t in failover.timelines)
            lines.append(
                f"  the database failed over on its own during the run (timeline {old} -> {new}, "
                "not injected by memcheck): what it lost then is its own loss too"
            )
    raised = result.raised
    calls = sum(1 for op in result.history.operations if op.client != "final")
    lines += checks_and_anomalies(result.anomalies, result.vendor, raised, calls, result.strict)
    return "\n".join(lines)


def checks_and_anomalies(
    anomalies: list,
    vendor: str = "",
    raised: Counter[str] | None = None,
    calls: int = 0,
    strict: bool = False,
) -> list[str]:
    """The checks' table, the counterexamples and the RESULT line of a run (or of a recorded run
    checked again). ``strict``: the run was judged with ``--strict`` (else check ``refusal`` is
    off)."""
    raised = raised or Counter()
    found = Counter(a.check for a in anomalies)
    lines = ["", f"  {'check':<19} {'result':<8} what it proves"]
    for check, meaning in CHECKS.items():
        verdict = f"FAIL {found[check]}" if found[check] else "pass"
        if check == "refusal" and not strict:
            verdict = "off"
        lines.append(f"  {check:<19} {verdict:<8} {meaning}")
    allowed = Counter({c: n for c, n in raised.items() if allowed_without_answer(c)})
    not_allowed = Counter({c: n for c, n in raised.items() if not allowed_without_answer(c)})
    if allowed:
        lines += [
            "",
            f"  {sum(allowed.values())} of {calls} calls raised to their caller without an "
            "answer, as the contract allows (not anomalies: the store said it could not):",
            *(f"    {count:>6} x {cause}" for cause, count in allowed.most_common(5)),
        ]
    if not_allowed:
        lines += [
            "",
            f"  {sum(not_allowed.values())} of {calls} calls raised an error the contract does "
            "not allow (anomalies: check caller-error):",
            *(f"    {count:>6} x {cause}" for cause, count in not_allowed.most_common(5)),
        ]
    if vendor == "sqlite" and any("locked" in cause for cause in raised):
        lines.append(
            "    SQLite writers that fail with 'database is locked' instead of waiting: see "
            "system check agentmemory.W001 (OPTIONS transaction_mode IMMEDIATE, timeout)"
        )
    if anomalies:
        lines += [
            "",
            f"{len(anomalies)} anomalies. Counterexamples (first {EXAMPLES_PER_CHECK} per check):",
        ]
        shown: Counter[str] = Counter()
        for anomaly in anomalies:
            shown[anomaly.check] += 1
            if shown[anomaly.check] > EXAMPLES_PER_CHECK:
                continue
            lines.append(
                f"- [{anomaly.check}] ({anomaly.session_id!r}, {anomaly.key!r}): {anomaly.message}"
            )
            for op in anomaly.operations[:4]:
                lines.append(
                    f"    op {op['id']} {op['kind']} {op['status']} expected={op['expected_version']} "
                    f"version={op['version']} value={op['value']} "
                    f"t=[{op['invoked_at']:.4f}, {op['completed_at'] or 0:.4f}]"
                    + (f" error={op['error']}" if op["error"] else "")
                )
        lines.append("\nRESULT: " + _verdict(found) + _raised_note(raised, calls))
    else:
        lines.append("\nRESULT: no anomaly" + _raised_note(raised, calls))
    return lines


def _verdict(found: Counter[str]) -> str:
    """The RESULT line's words: the database's own losses apart from the store's anomalies."""
    own = sum(n for check, n in found.items() if check in DATABASE_OWN)
    theirs = sum(found.values()) - own
    if not own:
        return "anomalies found"
    lost = (
        f"the database lost {own} acknowledged write(s): taken back by a failover (a standby "
        "that had not received them) or a restore"
    )
    if theirs:
        return f"anomalies found ({theirs}), and {lost}"
    return f"{lost}; no anomaly of the store or its cache tier"


def _raised_note(raised: Counter[str], calls: int) -> str:
    return f" ({sum(raised.values())} of {calls} calls raised, see above)" if raised else ""


def render_junit(result: RunResult) -> str:
    """The run as JUnit XML (the Ant/Jenkins schema CI systems read): one test suite, one test
    case per check -- failed with the count and its anomalies' one-line explanations (the first
    :data:`JUNIT_ANOMALIES`), passed otherwise."""
    found: dict[str, list] = {}
    for anomaly in result.anomalies:
        found.setdefault(anomaly.check, []).append(anomaly)
    cases = []
    for check, meaning in CHECKS.items():
        anomalies = found.get(check, [])
        lines = [
            f"[{a.check}] ({a.session_id!r}, {a.key!r}): {a.message}"
            for a in anomalies[:JUNIT_ANOMALIES]
        ]
        if len(anomalies) > JUNIT_ANOMALIES:
            lines.append(f"... and {len(anomalies) - JUNIT_ANOMALIES} more")
        cases.append((check, meaning, anomalies, lines))
    return _junit(
        f"memcheck ({result.vendor}, database {result.database})",
        f"memcheck.{result.vendor.lower().replace(' ', '_')}",
        result.seconds,
        {
            "run_id": result.run_id,
            "database": result.database,
            "faults": result.faults,
            "operations": str(len(result.history.operations)),
            "workers": str(result.config.workers),
            "seed": str(result.config.seed),
        },
        [
            (check, meaning, f"{len(anomalies)} anomalies: {anomalies[0].message}", lines)
            if anomalies
            else (check, meaning, None, [])
            for check, meaning, anomalies, lines in cases
        ],
    )


def render_self_test_junit(result: SelfTestResult) -> str:
    """The self-test as JUnit XML: one test case per variant (the real store first) -- failed
    when the real store had an anomaly or a variant slipped through, skipped when it cannot show
    here (with the reason)."""
    cases = []
    for outcome in result.outcomes:
        failure = None
        if not outcome.passed:
            failure = (
                f"the real store: {outcome.example}"
                if outcome.name == REAL
                else "no check caught it"
            )
        caught = ", ".join(f"{check} ({n})" for check, n in outcome.caught.most_common())
        lines = [f"caught by: {caught}"] if caught and outcome.name != REAL else []
        cases.append((outcome.name, outcome.description, failure, lines))
    return _junit(
        f"memcheck --self-test ({result.vendor}, database {result.database})",
        f"memcheck.selftest.{result.vendor.lower().replace(' ', '_')}",
        result.seconds,
        {"database": result.database, "cache": result.cache or "", "faults": result.faults},
        cases,
        skipped={o.name: o.reason for o in result.outcomes if not o.applicable},
    )


def _junit(
    name: str,
    classname: str,
    seconds: float,
    properties: dict[str, str],
    cases: list[tuple[str, str, str | None, list[str]]],
    skipped: dict[str, str] | None = None,
) -> str:
    """A JUnit document of one suite; ``cases``: (name, what it proves, the failure's message or
    None, the failure's lines); ``skipped``: case name -> why."""
    skipped = skipped or {}
    root = ElementTree.Element("testsuites")
    suite = ElementTree.SubElement(
        root,
        "testsuite",
        name=name,
        tests=str(len(cases)),
        failures=str(sum(1 for _, _, failure, _ in cases if failure is not None)),
        errors="0",
        skipped=str(len(skipped)),
        time=f"{seconds:.3f}",
        timestamp=datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
    )
    listed = ElementTree.SubElement(suite, "properties")
    for key, value in properties.items():
        ElementTree.SubElement(listed, "property", name=key, value=value)
    for case_name, meaning, failure, lines in cases:
        case = ElementTree.SubElement(
            suite, "testcase", name=case_name, classname=classname, time="0"
        )
        if case_name in skipped:
            ElementTree.SubElement(case, "skipped", message=skipped[case_name])
        elif failure is not None:
            element = ElementTree.SubElement(case, "failure", message=failure, type=case_name)
            element.text = "\n".join([meaning, *lines])
        else:
            ElementTree.SubElement(case, "system-out").text = "\n".join([meaning, *lines])
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
