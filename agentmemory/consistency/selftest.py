"""``memcheck --self-test``: memcheck shown to catch each kind of bug, on this database and cache.

The real store runs first and must pass. Then each variant of the catalogue -- the real store with
one :class:`~agentmemory.defects.Defect` planted -- runs the same workload (the default one, with
the same faults) in throw-away sessions, and must be caught: at least one anomaly. A variant that
slips through one run gets ``attempts`` runs in all, each with another seed; the report says
which checks caught it and in which run. A variant that cannot show here (a cache defect without
a cache tier, a defect of the retry path where no transient error can be provoked) is reported as
not applicable, with the reason, and does not count.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.db import connections

from ..defects import (
    ADK_DEFECTS,
    CACHE_DEFECTS,
    CHECKPOINT_DEFECTS,
    DESCRIPTIONS,
    LOG_DEFECTS,
    SDK_DEFECTS,
    Defect,
)
from .checker import DATABASE_OWN
from .faults import FaultsUnavailable
from .mcp import WORKLOADS as MCP_WORKLOADS
from .runner import RunResult, make_store, run_memcheck
from .sharded import run_across_shards, shards_for_moves
from .workloads import WorkloadConfig, importable


@dataclass
class Outcome:
    """One line of the self-test's table."""

    name: str
    description: str
    applicable: bool = True
    reason: str = ""  # why not applicable
    caught: Counter[str] = field(default_factory=Counter)  # anomalies by check, of the catching run
    runs: int = 0
    operations: int = 0
    seconds: float = 0.0
    example: str = ""  # the first anomaly's message
    fault_errors: list[str] = field(default_factory=list)  # of the last run: why a fault did not

    @property
    def passed(self) -> bool:
        """The real store: no anomaly; a variant: caught (or not applicable here)."""
        if not self.applicable:
            return True
        return not self.caught if self.name == REAL else bool(self.caught)

    def as_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "caught": dict(self.caught), "passed": self.passed}


REAL = "(the real store)"
#: Variants of the tier's second safeguards, each shown only by the fault that breaks its
#: partner -- one of the faults on the run's own keys, in every mode but none.
PARTNER_FAULTS = {
    # an entry that outlives its memory
    Defect.HIT_EXPIRY_UNCHECKED: "redis-clock",
    # a writer dead between its COMMIT and its update: its fill leases are never deleted
    Defect.FILL_IGNORES_VERSION: "writer-crash",
    # a newer entry evicted before a slow fill: no version left in Redis to refuse it
    Defect.FILL_IGNORES_LEASE: "cache-evict",
    # a renewal that stalls after its pending check while a writer records one and waits
    Defect.FENCE_FROM_RENEWAL: "fence-race",
    # the same, the renewal after the writer's wait: only the replay keeps Redis from being
    # trusted with the version before the write
    Defect.RENEWAL_IGNORES_PENDING: "fence-race",
}
#: Variants that show only under a fault: a transient database error to retry; a Redis restart
#: (a connection that reconnects to another server process); the partner faults above.
NEEDS_FAULTS = frozenset({Defect.NOT_RETRIED, Defect.SERVER_ID_KEPT, *PARTNER_FAULTS})
#: Variants the workload's races show now and then, and a fault of every mode but none in every
#: run: they run under the run's faults too (a fill without its lease: cache-evict).
SHOWN_BY_FAULTS = frozenset({Defect.FILL_WITHOUT_LEASE})
#: Variants that show only under a fault of their own, whatever the run's: a restore.
OWN_FAULTS = {Defect.RESTORE_UNSEEN: "restore", Defect.ORM_UNSEEN: "orm"}


@dataclass
class SelfTestResult:
    database: str
    vendor: str
    cache: str | None
    faults: str
    outcomes: list[Outcome]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(outcome.passed for outcome in self.outcomes)


def not_applicable(
    defect: Defect, *, cache: str | None, vendor: str, faults: str, workloads: Sequence[str] = ()
) -> str:
    """Why ``defect`` cannot show on this configuration ('' when it can)."""
    if (
        defect
        in (Defect.STALE_VECTOR, Defect.SEARCH_IGNORES_EXPIRY, Defect.SEARCH_KEEPS_FIRST_SCORES)
        and "search" not in workloads
    ):
        return "the search workload does not run (numpy is not installed, or --workloads)"
    if defect in LOG_DEFECTS and "log" not in workloads:
        return "the log workload does not run (--workloads)"
    if defect in SDK_DEFECTS and "sdk-session" not in workloads:
        return (
            "the sdk-session workload does not run (openai-agents is not installed, or --workloads)"
        )
    if defect in ADK_DEFECTS and "adk" not in workloads:
        return "the adk workload does not run (google-adk is not installed, or --workloads)"
    if defect is Defect.MCP_SHARED_SESSIONS and not importable("mcp"):
        return "the MCP SDK is not installed (pip install '.[mcp]'): nothing runs --via mcp"
    if defect in CHECKPOINT_DEFECTS and "checkpoint" not in workloads:
        return "the checkpoint workload does not run (--workloads)"
    if defect in CACHE_DEFECTS and cache is None:
        return "no cache tier (AGENTMEMORY['CACHE'] is not set)"
    if defect is Defect.SERVER_ID_KEPT and cache is not None and faults not in ("cache", "all"):
        return (
            "no Redis server restarts here (--faults cache restarts the Redis memcheck starts, "
            "and a connection reconnects to the new process)"
        )
    if defect in PARTNER_FAULTS and cache is not None and faults == "none":
        return f"--faults none: the {PARTNER_FAULTS[defect]} fault that shows it does not run"
    if defect is Defect.RESTORE_UNSEEN and faults == "none":
        return "no database fault runs here (the database is not on this machine)"
    if defect is Defect.UPSERT_SKIPS_HISTORY and vendor != "postgresql":
        return "the one-statement write function is PostgreSQL's (migration 0008)"
    if defect is Defect.PUT_FUNCTION_FORKS and vendor != "postgresql":
        return "the checkpoint put function is PostgreSQL's (migration 0012)"
    if defect is Defect.NOT_RETRIED:
        if vendor == "sqlite":
            return (
                "SQLite writers wait out a held lock within their busy timeout: no transient "
                "error arises to retry"
            )
        if faults == "none":
            return "no database fault runs here (the database is not on this machine)"
    return ""


def run_self_test(
    aliases: Sequence[str],
    config: WorkloadConfig,
    *,
    faults: str,
    attempts: int = 3,
    defects: Sequence[Defect] = tuple(Defect),
    on_outcome: Callable[[Outcome], None] | None = None,
) -> SelfTestResult:
    """The real store, then each variant in ``defects``; ``on_outcome`` is called after each
    (for progress)."""
    started = time.monotonic()
    database = aliases[0]
    cache = make_store(database, False).cache_alias
    vendor = connections[database].vendor
    outcomes = []

    def run(planted: tuple[Defect, ...], seed: int) -> RunResult:
        # The real store under the run's faults; a variant under them only if it needs them to
        # show (the rest are caught without, in less time).
        needs = not planted or any(d in NEEDS_FAULTS | SHOWN_BY_FAULTS for d in planted)
        own = next((OWN_FAULTS[d] for d in planted if d in OWN_FAULTS), None)
        run_config = dataclasses.replace(config, seed=seed)
        if Defect.MCP_SHARED_SESSIONS in planted:
            # A defect of the MCP server: its variant runs the workloads through it.
            run_config = dataclasses.replace(run_config, via="mcp", workloads=MCP_WORKLOADS)
        return run_memcheck(
            list(aliases),
            run_config,
            faults=own or (faults if needs else "none"),
            defects=planted,
        )

    def run_moves(planted: tuple[Defect, ...], seed: int) -> RunResult:
        # Sessions moved between shards under the workload: the database and another shard
        # (AGENTMEMORY["SHARDS"], or a SQLite shard of memcheck's own).
        with shards_for_moves(database) as shards:
            return run_across_shards(
                shards, dataclasses.replace(config, seed=seed), defects=planted
            )

    real = Outcome(REAL, "the store as it ships")
    _record(real, run((), config.seed))
    moves_reason = ""
    if Defect.UNGATED_WRITES in defects:  # the real store across shards too, as its variant
        try:
            _record(real, run_moves((), config.seed), merge=True)
        except FaultsUnavailable as exc:
            moves_reason = str(exc)
    outcomes.append(real)
    if on_outcome:
        on_outcome(real)
    for defect in defects:
        outcome = Outcome(defect.value, DESCRIPTIONS[defect])
        outcome.reason = not_applicable(
            defect, cache=cache, vendor=vendor, faults=faults, workloads=config.workloads
        )
        if defect is Defect.UNGATED_WRITES and not outcome.reason:
            outcome.reason = moves_reason
        outcome.applicable = not outcome.reason
        for attempt in range(attempts if outcome.applicable else 0):
            runner = run_moves if defect is Defect.UNGATED_WRITES else run
            _record(outcome, runner((defect,), config.seed + 1 + attempt))
            if outcome.caught:
                break
        outcomes.append(outcome)
        if on_outcome:
            on_outcome(outcome)
    return SelfTestResult(
        database=",".join(aliases),
        vendor=connections[database].display_name,
        cache=cache,
        faults=faults,
        outcomes=outcomes,
        seconds=time.monotonic() - started,
    )


def _record(outcome: Outcome, result: RunResult, *, merge: bool = False) -> None:
    """``result`` into ``outcome``: its anomalies replace the last run's (a variant's runs are
    tries), or, ``merge``, add to them (the real store's second run, across shards)."""
    outcome.runs += 1
    outcome.operations += len(result.history.operations)
    outcome.seconds += result.seconds
    # What the database itself lost (a failover the run injected) is neither the real store's
    # failure nor a planted bug caught.
    found = [a for a in result.anomalies if a.check not in DATABASE_OWN]
    caught = Counter(anomaly.check for anomaly in found)
    outcome.caught = outcome.caught + caught if merge else caught
    outcome.fault_errors = list(result.fault_errors)
    if found:
        outcome.example = f"[{found[0].check}] {found[0].message}"


def render_self_test(result: SelfTestResult) -> str:
    cache = f"cache {result.cache!r}" if result.cache else "no cache tier"
    lines = [
        f"memcheck --self-test on {result.vendor} (database {result.database!r}), {cache}, "
        f"faults: {result.faults}",
        "",
        f"  {'variant':<30} {'result':<8} {'runs':>4}  caught by (anomalies)",
    ]
    for outcome in result.outcomes:
        if not outcome.applicable:
            verdict, detail = "n/a", outcome.reason
        elif outcome.name == REAL:
            verdict = "pass" if outcome.passed else "FAIL"
            detail = "no anomaly" if outcome.passed else _checks(outcome)
        else:
            verdict = "caught" if outcome.passed else "MISSED"
            detail = _checks(outcome) if outcome.passed else "no check caught it"
        runs = str(outcome.runs) if outcome.applicable else "-"
        lines.append(f"  {outcome.name:<30} {verdict:<8} {runs:>4}  {detail}")
    variants = [o for o in result.outcomes if o.name != REAL and o.applicable]
    caught = sum(o.passed for o in variants)
    lines += [
        "",
        f"{caught} of {len(variants)} variants caught"
        + (
            f" ({len(result.outcomes) - 1 - len(variants)} not applicable here)"
            if len(variants) < len(result.outcomes) - 1
            else ""
        )
        + f"; the real store {'passed' if result.outcomes[0].passed else 'FAILED'}; "
        f"{result.seconds:.0f}s",
        "RESULT: " + ("self-test passed" if result.ok else "self-test FAILED"),
    ]
    missed = [o for o in result.outcomes if not o.passed]
    for outcome in missed:
        if outcome.name == REAL:
            lines.append(f"  the real store: {outcome.example}")
        else:
            lines.append(f"  missed: {outcome.name} -- {outcome.description}")
    return "\n".join(lines) + "\n"


def _checks(outcome: Outcome) -> str:
    return ", ".join(f"{check} ({n})" for check, n in outcome.caught.most_common())
