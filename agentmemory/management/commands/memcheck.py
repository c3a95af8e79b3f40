"""``manage.py memcheck``: prove the store keeps its promises on this database, or show where not."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from ...conf import get_config
from ...consistency import recorded
from ...consistency.audit import DEFAULT_GRACE_SECONDS, audit
from ...consistency.checker import refusals
from ...consistency.faults import FAULTS, FaultsUnavailable, fault_kinds
from ...consistency.html import write_report, write_self_test_report
from ...consistency.mcp import WORKLOADS as MCP_WORKLOADS
from ...consistency.report import (
    checks_and_anomalies,
    render_json,
    render_junit,
    render_self_test_junit,
    render_text,
)
from ...consistency.runner import Progress, RunResult, run_memcheck
from ...consistency.selftest import Outcome, render_self_test, run_self_test
from ...consistency.sharded import run_across_shards
from ...consistency.workloads import DEFAULT_WORKLOADS, VIAS, WORKLOADS, WorkloadConfig
from ...errors import MemoryUnavailable
from ...models import Memory
from ...store import MemoryStore


def workload_list(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    try:
        WorkloadConfig(workloads=chosen)
    except ValueError as exc:  # argparse shows this message, naming the option
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return chosen


#: Most client threads per process (each holds a database connection).
WORKERS_MAX = 512
PROCESSES_MAX = 64


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def workers(text: str) -> int:
    value = positive(text)
    if value > WORKERS_MAX:
        raise argparse.ArgumentTypeError(
            f"at most {WORKERS_MAX} client threads per process (each holds a database "
            "connection); use --processes for more clients"
        )
    return value


def processes(text: str) -> int:
    value = int(text)
    if not 0 <= value <= PROCESSES_MAX:
        raise argparse.ArgumentTypeError(f"from 0 (threads only) to {PROCESSES_MAX}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds > 0, got {text}")
    return value


#: The line of the shards' table for the run across every shard, its sessions moving.
MOVES = "moves"


class Command(BaseCommand):
    help = (
        "Run a concurrent workload against the configured database in throw-away sessions, record "
        "every operation and check for lost updates, gaps, duplicates, cross-session, stale and "
        "expired reads. Exit 0: no anomaly; 1: anomalies found; 2: could not run."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # An abbreviation is refused, not taken for the one option it starts (``--force`` was
        # taken as Django's --force-color, ``--rep`` as --report).
        parser.allow_abbrev = False
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="database alias (default: AGENTMEMORY['DATABASE'], or with "
            "AGENTMEMORY['SHARDS'] each shard in turn), or the aliases of one cluster's nodes, "
            "comma-separated (default,node2,node3): the clients are spread over them, each "
            "pinned to one node",
        )
        parser.add_argument(
            "--workers",
            type=workers,
            default=8,
            help=f"client threads per process, 1 to {WORKERS_MAX} (default: %(default)s)",
        )
        parser.add_argument(
            "--processes",
            type=processes,
            default=0,
            help="run the workers in N processes, each with --workers threads (default: 0, "
            "threads of this process only)",
        )
        parser.add_argument(
            "--keys",
            type=positive,
            default=3,
            help="hot keys per family and session (default: %(default)s)",
        )
        budget = parser.add_mutually_exclusive_group()
        budget.add_argument(
            "--ops",
            type=positive,
            default=None,
            help="total operations (default 2000; with --faults, 10 seconds instead)",
        )
        budget.add_argument(
            "--seconds", type=seconds, default=None, help="run for S seconds (> 0) instead"
        )
        parser.add_argument(
            "--faults",
            choices=list(FAULTS),
            default=None,
            help="inject faults while the workload runs (servers on this machine only): lock = "
            "hold competing locks a moment (the default where the database is on this machine, "
            "none elsewhere); db = that and kill connections server-side; cache = kill, pause, "
            "restart and fail over a Redis memcheck starts; all = db and cache; restore = put "
            "back a dump of the run's sessions a moment after taking it (what it loses is "
            "reported as the database's own loss; reads may show it for two fence periods); "
            "orm = ORM deletes and updates of memories the cache tier holds (db and all run "
            "them too, with a cache tier)",
        )
        parser.add_argument(
            "--workloads",
            type=workload_list,
            default=DEFAULT_WORKLOADS,
            help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all; search "
            "where numpy is installed)",
        )
        parser.add_argument(
            "--via",
            choices=VIAS,
            default="store",
            help="whose calls the clients make: the store's (default), or the MCP server's tools "
            "(manage.py agentmemory_mcp; two principals whose sessions share names; without "
            f"--workloads: {','.join(MCP_WORKLOADS)})",
        )
        parser.add_argument(
            "--unsafe",
            action="store_true",
            help="use an unlocked read-then-write path (must find anomalies)",
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help="also count as anomalies (check refusal) the calls refused without an answer "
            "that a correct deployment would have answered: MemoryUnavailable with no injected "
            "fault that explains it, SQLite's 'database is locked' beyond 0.1%% of the calls",
        )
        parser.add_argument(
            "--audit", action="store_true", help="only check the data already stored, read-only"
        )
        parser.add_argument(
            "--self-test",
            action="store_true",
            help="run the workload against the real store, then against each deliberately broken "
            "variant (agentmemory.defects): exit 0 only if the real store passes and every "
            "variant is caught",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=DEFAULT_GRACE_SECONDS,
            metavar="SECONDS",
            help="--audit reports live rows expired longer ago than this (default: %(default)s)",
        )
        parser.add_argument(
            "--format",
            choices=["text", "json"],
            default="text",
            help="the report on standard output: a table, or JSON (default: %(default)s)",
        )
        parser.add_argument(
            "--seed",
            type=int,
            default=0,
            help="seed of the workload's random choices: the same seed, the same operations "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--history",
            metavar="FILE",
            help="save the recorded history as JSON lines, with the final state it was checked "
            "against (--check FILE checks it again)",
        )
        parser.add_argument(
            "--report",
            metavar="DIR",
            help="also write the run as a page to look at: DIR/index.html (plots of throughput "
            "and latency with the faults shaded, the checks, each anomaly's operations) and "
            "DIR/history.jsonl. DIR must be new or empty (see --force); it is checked before "
            "the run",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="--report into a folder that is not empty: the report's files replace those "
            "of the same names (a symbolic link among them is replaced, never followed)",
        )
        parser.add_argument(
            "--check",
            metavar="FILE",
            help="check a history saved by --history again, offline (no database is touched): "
            "the same checks on the same input",
        )
        parser.add_argument(
            "--junit",
            metavar="FILE",
            help="also write the result as JUnit XML (a test case per check, or per self-test "
            "variant) for CI systems",
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the run's sessions for inspection"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        shards = get_config()["SHARDS"] if options["database"] is None else None
        if shards and not options["check"]:
            for option in ("audit", "self_test", "history", "junit", "report"):
                if options[option]:
                    flag = "--" + option.replace("_", "-")
                    raise CommandError(
                        f"{flag} runs on one database: across AGENTMEMORY['SHARDS'] give it "
                        f"--database SHARD, once per shard ({', '.join(shards)})",
                        returncode=2,
                    )
        if options["report"]:
            _prepare_report_folder(options["report"], options["force"])
        elif options["force"]:
            raise CommandError("--force applies to --report DIR only", returncode=2)
        if options["strict"] and (options["check"] or options["audit"] or options["self_test"]):
            raise CommandError(
                "--strict judges a run's refused calls: not with --check, --audit or --self-test",
                returncode=2,
            )
        if options["junit"]:
            _check_writable(options["junit"], "junit")
        if options["check"]:
            return self._check(options["check"], options)
        if shards:
            return self._across_shards(list(shards), options)
        aliases = [a.strip() for a in (options["database"] or get_config()["DATABASE"]).split(",")]
        for alias in aliases:
            if alias not in connections.settings:
                raise CommandError(f"unknown database alias {alias!r}", returncode=2)
        if len(set(aliases)) != len(aliases) or not all(aliases):
            raise CommandError(f"--database lists an alias twice or empty: {aliases}", returncode=2)
        if options["history"]:
            _check_writable(options["history"])
        for alias in aliases:
            self._check_ready(alias)
        self._check_cache()
        database = aliases[0]
        if options["audit"]:
            return self._audit(database, options["format"], options["grace"])
        options["faults"] = self._faults(aliases, options["faults"], options["unsafe"])
        if options["self_test"]:
            return self._self_test(aliases, options)
        self._run(aliases, options)

    def _faults(self, aliases: list[str], asked: str | None, unsafe: bool) -> str:
        """The faults asked for, or by default the cheapest -- competing locks held a moment --
        where the database is on this machine."""
        if asked is not None:
            return asked
        try:
            fault_kinds("lock", aliases[0], None, aliases[1:])
        except FaultsUnavailable as exc:
            self.stderr.write(f"memcheck: no default fault here ({exc})")
            return "none"
        return "lock"

    def _config(self, options: dict[str, Any]) -> WorkloadConfig:
        # Without a budget: 2,000 operations; under heavier faults 10 seconds, so that every
        # kind of fault is injected several times (2,000 operations take about two seconds).
        light = options["faults"] in ("none", "lock")
        default_ops, default_seconds = (2000, None) if light else (None, 10.0)
        budget = options["ops"] or options["seconds"]
        workloads = options["workloads"]
        via = options.get("via", "store")
        if via == "mcp" and workloads is DEFAULT_WORKLOADS:
            workloads = MCP_WORKLOADS
        try:
            return WorkloadConfig(
                workers=options["workers"],
                keys=options["keys"],
                seed=options["seed"],
                ops=options["ops"] if budget else default_ops,
                seconds=options["seconds"] if budget else default_seconds,
                workloads=workloads,
                via=via,
            )
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _self_test(self, aliases: list[str], options: dict[str, Any]) -> None:
        if options["unsafe"] or options["processes"]:
            raise CommandError(
                "--self-test runs its own variants in threads: drop --unsafe and --processes",
                returncode=2,
            )

        def progress(outcome: Outcome) -> None:
            verdict = "n/a" if not outcome.applicable else "ok" if outcome.passed else "NOT OK"
            self.stderr.write(
                f"self-test: {outcome.name}: {verdict} ({outcome.runs} runs, "
                f"{outcome.seconds:.1f}s)"
            )

        try:
            result = run_self_test(
                aliases, self._config(options), faults=options["faults"], on_outcome=progress
            )
        except FaultsUnavailable as exc:
            raise CommandError(str(exc), returncode=2) from exc
        except (DatabaseError, MemoryUnavailable) as exc:
            raise CommandError(f"memcheck could not run: {exc}", returncode=2) from exc
        if options["format"] == "json":
            self.stdout.write(
                json.dumps(
                    {
                        "database": result.database,
                        "vendor": result.vendor,
                        "cache": result.cache,
                        "faults": result.faults,
                        "seconds": round(result.seconds, 1),
                        "ok": result.ok,
                        "variants": [o.as_dict() for o in result.outcomes],
                    },
                    indent=2,
                )
            )
        else:
            self.stdout.write(render_self_test(result))
        self._write_extras(options, result, render_self_test_junit, write_self_test_report)
        if not result.ok:
            raise SystemExit(1)

    def _check_cache(self) -> None:
        """The cache tier's Redis answers, or exit 2 with one line within seconds (a database
        index out of range died with a raw ResponseError traceback after 14 s)."""
        alias = get_config()["CACHE"]
        if alias is None:
            return
        from ...cache import probe_cache

        problem = probe_cache(alias)
        if problem is not None:
            raise CommandError(f"memcheck could not run: {problem}", returncode=2)

    def _check_ready(self, database: str) -> None:
        # A fresh connection: one left from before (a node restarted since) would fail here.
        connections[database].close()
        try:
            executor = MigrationExecutor(connections[database])
            unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes("agentmemory"))
            if unapplied:
                raise CommandError(
                    f"database {database!r} lacks agentmemory migrations "
                    f"({', '.join(m.name for m, _ in unapplied)}): run "
                    f"`manage.py migrate --database {database}` first",
                    returncode=2,
                )
            Memory.objects.using(database).exists()
        except DatabaseError as exc:
            raise CommandError(
                f"cannot use database {database!r}: {exc}. Is the server running, and did you run "
                f"`manage.py migrate --database {database}`?",
                returncode=2,
            ) from exc

    def _across_shards(self, shards: list[str], options: dict[str, Any]) -> None:
        """Without ``--database`` and with ``AGENTMEMORY["SHARDS"]``: a run on each shard in
        turn (every guarantee holds within a session, so within its shard), each shard's report,
        then one line per shard and the whole run's verdict. A shard that cannot run is reported
        and the others still run: exit 2 if one could not run, else 1 if one found anomalies."""
        self._check_cache()
        asked = options["faults"]
        verdicts: dict[str, tuple[str, RunResult | None]] = {}
        for alias in shards:
            self.stderr.write(f"memcheck: shard {alias} ({connections[alias].vendor})")
            try:
                self._check_ready(alias)
                options["faults"] = self._faults([alias], asked, options["unsafe"])
                result = self._result([alias], options)
            except CommandError as exc:
                self.stderr.write(f"memcheck: shard {alias} could not run: {exc}")
                verdicts[alias] = (f"could not run: {exc}", None)
                continue
            verdicts[alias] = ("NOT OK" if result.anomalies else "ok", result)
            if options["format"] != "json":
                self.stdout.write(f"== shard {alias}\n" + render_text(result))
        if len(shards) > 1 and all(r is not None for _, r in verdicts.values()):
            # Then one run across them all, its sessions moved from shard to shard meanwhile.
            self.stderr.write(f"memcheck: across shards {', '.join(shards)}, sessions moving")
            config = self._config(options)
            try:
                with Progress(config.ops, config.seconds, stream=self.stderr._out) as progress:
                    moved = run_across_shards(
                        shards,
                        config,
                        unsafe=options["unsafe"],
                        keep=options["keep"],
                        progress=progress.tick,
                    )
            except (DatabaseError, MemoryUnavailable) as exc:
                self.stderr.write(f"memcheck: the run across shards could not run: {exc}")
                verdicts[MOVES] = (f"could not run: {exc}", None)
            else:
                verdicts[MOVES] = ("NOT OK" if moved.anomalies else "ok", moved)
                if options["format"] != "json":
                    self.stdout.write(f"== {MOVES}\n" + render_text(moved))
        # Every run ran (the run across them only when every shard's did) and found nothing.
        ok = all(r is not None and not r.anomalies for _, r in verdicts.values())
        if options["format"] == "json":
            self.stdout.write(
                json.dumps(
                    {
                        "shards": {
                            alias: {"verdict": verdict, "run": r.as_dict() if r else None}
                            for alias, (verdict, r) in verdicts.items()
                        },
                        "ok": ok,
                    },
                    indent=2,
                    default=str,
                )
            )
        else:
            lines = ["", "shard        vendor       operations  anomalies  verdict"]
            for alias, (verdict, r) in verdicts.items():
                ops = str(len(r.history.operations)) if r else "-"
                found = str(len(r.anomalies)) if r else "-"
                vendor = "(all)" if alias == MOVES else connections[alias].vendor
                lines.append(f"{alias:<12} {vendor:<12} {ops:>10}  {found:>9}  {verdict}")
            lines.append(f"whole run: {'ok' if ok else 'NOT OK'} ({len(shards)} shards)")
            self.stdout.write("\n".join(lines))
        if any(r is None for _, r in verdicts.values()):
            raise SystemExit(2)
        if not ok:
            raise SystemExit(1)

    def _run(self, aliases: list[str], options: dict[str, Any]) -> None:
        result = self._result(aliases, options)
        self.stdout.write(
            render_json(result) if options["format"] == "json" else render_text(result)
        )
        self._write_extras(options, result, render_junit, write_report)
        if result.anomalies:
            raise SystemExit(1)

    def _result(self, aliases: list[str], options: dict[str, Any]) -> RunResult:
        """One run on ``aliases`` (one database, or one cluster's nodes), its --history saved."""
        database = ",".join(aliases)
        config = self._config(options)
        try:
            with Progress(config.ops, config.seconds, stream=self.stderr._out) as progress:
                result = run_memcheck(
                    aliases,
                    config,
                    processes=options["processes"],
                    unsafe=options["unsafe"],
                    keep=options["keep"],
                    faults=options["faults"],
                    progress=progress,
                )
        except FaultsUnavailable as exc:
            raise CommandError(str(exc), returncode=2) from exc
        except (DatabaseError, MemoryUnavailable) as exc:
            raise CommandError(
                f"memcheck could not run on {database!r}: {exc}", returncode=2
            ) from exc
        except RuntimeError as exc:  # e.g. "can't start new thread": the machine's limits
            raise CommandError(
                f"memcheck could not start its clients: {exc} (fewer --workers?)", returncode=2
            ) from exc
        if options["strict"]:
            result.strict = True
            result.anomalies += refusals(
                result.history, connections[aliases[0]].vendor, result.faults_injected
            )
        if options["history"]:
            try:
                recorded.save(options["history"], result.history, result.final)
            except OSError as exc:
                raise CommandError(
                    f"cannot write --history {options['history']}: {exc}", returncode=2
                ) from exc
        return result

    def _write_extras(
        self,
        options: dict[str, Any],
        result: Any,
        junit: Callable[[Any], str],
        report: Callable[[Any, str], Path],
    ) -> None:
        """``--junit FILE`` and ``--report DIR`` of a run or a self-test, when asked for."""
        where = ""
        try:
            if options["junit"]:
                where = f"--junit {options['junit']}"
                Path(options["junit"]).write_text(junit(result), encoding="utf-8")
            if options["report"]:
                where = f"--report {options['report']}"
                page = _write_into(options["report"], lambda folder: report(result, folder))
                self.stderr.write(f"memcheck: the report is {page}")
        except OSError as exc:
            raise CommandError(f"cannot write {where}: {exc}", returncode=2) from exc

    def _check(self, path: str, options: dict[str, Any]) -> None:
        fmt = options["format"]
        try:
            history, final = recorded.load(path)
        except OSError as exc:
            raise CommandError(f"cannot read --check {path}: {exc}", returncode=2) from exc
        except (ValueError, MemoryError) as exc:
            raise CommandError(f"cannot check --check {path}: {exc}", returncode=2) from exc
        try:
            anomalies = final.anomalies(history)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # Records of the right shape holding what no run records (a hand-edited file).
            raise CommandError(
                f"cannot check --check {path}: its records are not a history memcheck saved "
                f"({type(exc).__name__}: {exc})",
                returncode=2,
            ) from exc
        result = RunResult(
            run_id=Path(path).stem,
            database=f"--check {path}",
            vendor="recorded",
            unsafe=False,
            config=WorkloadConfig(),
            history=history,
            anomalies=anomalies,
            seconds=0.0,
            final=final,
        )
        self._write_extras(options, result, render_junit, write_report)
        if fmt == "json":
            self.stdout.write(
                json.dumps(
                    {
                        "history": path,
                        "operations": len(history.operations),
                        "anomalies": [a.as_dict() for a in anomalies],
                    },
                    indent=2,
                    default=str,
                )
            )
        else:
            self.stdout.write(
                "\n".join(
                    [
                        f"memcheck --check {path}: {len(history.operations)} operations "
                        "recorded, checked again offline",
                        *checks_and_anomalies(anomalies),
                    ]
                )
            )
        if anomalies:
            raise SystemExit(1)

    def _audit(self, database: str, fmt: str, grace: float) -> None:
        cache = MemoryStore(using=database).cache
        audited, anomalies = audit(database, cache=cache, grace_seconds=grace)
        if fmt == "json":
            self.stdout.write(
                json.dumps(
                    {"memories": audited, "anomalies": [a.as_dict() for a in anomalies]},
                    indent=2,
                    default=str,
                )
            )
        else:
            self.stdout.write(
                f"memcheck --audit on {database!r}"
                + (f" and cache {cache.alias!r}" if cache is not None else "")
                + f": {audited} memories, {len(anomalies)} anomalies"
            )
            for anomaly in anomalies[:50]:
                self.stdout.write(
                    f"- [{anomaly.check}] ({anomaly.session_id!r}, {anomaly.key!r}): {anomaly.message}"
                )
            if cache is not None and any(a.check.startswith("cache") for a in anomalies):
                self.stdout.write(
                    "The tier serves what the database does not hold: `manage.py repaircache"
                    f" --database {database}` deletes those entries (docs/redis.md)."
                )
        if anomalies:
            raise SystemExit(1)


def _prepare_report_folder(path: str, force: bool) -> None:
    """``--report DIR`` checked before the run: a folder (created if missing) that this
    process can write into, and empty unless ``--force`` -- said now, not after the run."""
    folder = Path(path)
    try:
        if folder.exists() and not folder.is_dir():
            raise CommandError(f"--report {path}: not a folder", returncode=2)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()) and not force:
            raise CommandError(
                f"--report {path}: the folder is not empty; choose a new or empty one, or pass "
                "--force to replace the report's files in it",
                returncode=2,
            )
        os.rmdir(tempfile.mkdtemp(prefix=".memcheck-", dir=folder))  # writable?
    except OSError as exc:
        raise CommandError(f"cannot write --report {path}: {exc}", returncode=2) from exc


def _write_into(path: str, write: Callable[[Path], Path]) -> Path:
    """``write`` the report into a new folder of a random name inside ``path``, then move each
    file into ``path``: a rename replaces a symbolic link planted there instead of writing
    through it (a symlinked history.jsonl wrote outside the folder). Returns the page."""
    folder = Path(path)
    staging = Path(tempfile.mkdtemp(prefix=".memcheck-", dir=folder))
    try:
        page = write(staging)
        for entry in staging.iterdir():
            os.replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder / page.name


def _check_writable(path: str, option: str = "history") -> None:
    """``--history FILE`` (``--junit FILE``) can be written: said before the run, not after."""
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise CommandError(f"cannot write --{option} {path}: {exc}", returncode=2) from exc
