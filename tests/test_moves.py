"""Sessions moved between shards online (agentmemory.moves, ``manage.py move_sessions``): every
row of a session -- memories and their histories, logs, checkpoint chains -- on the new shard and
nothing left behind but its gate; reads the same from every process, before, during and after;
a write that meets the move waits and lands on the new shard, never behind the copy (and without
the gate, the declared defect, it is lost: the test bites); writers racing many moves lose and
double nothing; a mover that died is finished by ``--resume``. The shards are the suite's two
databases, ``default`` (this run's backend) and ``other`` (SQLite): moves cross engines."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from agentmemory import (
    IdempotencyKeyReused,
    Index,
    InvalidMemory,
    MemoryUnavailable,
    SessionMoved,
    ShardedStore,
)
from agentmemory.consistency.faults import FaultsUnavailable
from agentmemory.consistency.sharded import SCRATCH_ALIAS, run_across_shards, shards_for_moves
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import Defect, hold_next_gate_wait, hold_next_move
from agentmemory.integrations.langgraph import AgentMemorySaver
from agentmemory.models import GateState, SessionGate
from agentmemory.moves import session_rows
from agentmemory.sharding import forget_checked, place, record_shards
from agentmemory.testing.embeddings import HashEmbedder

from .conftest import redis_alias
from .helpers import child_database_url
from .test_langgraph_checkpointer import config, put_step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

SHARDS = ["default", "other"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _checked_again():
    forget_checked()


@pytest.fixture(params=["db", "redis"])
def sharded(request) -> ShardedStore:
    return ShardedStore(SHARDS, cache=None if request.param == "db" else redis_alias())


def started(work, *args) -> threading.Thread:
    """``work(*args)`` on a thread of its own, which closes its connections when it ends."""

    def run() -> None:
        try:
            work(*args)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def session_on(store: ShardedStore, alias: str, stem: str = "user") -> str:
    return next(f"{stem}-{n}" for n in range(100) if store.place(f"{stem}-{n}") == alias)


def elsewhere(alias: str) -> str:
    return next(a for a in SHARDS if a != alias)


def fill(store: ShardedStore, session: str) -> None:
    """A session of every kind of row: a memory with a history, a forgotten one, one with a
    TTL, a log with a popped item, a checkpoint chain with pending writes."""
    for step in range(3):
        store.remember(session, "plan", {"step": step})
    store.remember(session, "old", "x")
    store.forget(session, "old")
    store.remember(session, "brief", "soon gone", ttl=3600)
    store.append(session, "chat", ["hello", "how are you", "oops"])
    store.pop(session, "chat")
    saver = AgentMemorySaver(store)
    latest = put_step(saver, put_step(saver, config(session), "root"), "next")
    saver.put_writes(latest, [("value", "pending")], "task-1")


def reads(store: ShardedStore, session: str) -> tuple:
    saver = AgentMemorySaver(store)
    latest = saver.get_tuple(config(session))
    return (
        store.recall(session, "plan").value,
        [v.version for v in store.history(session, "plan")],
        store.recall(session, "old"),
        store.recall(session, "brief").value,
        [item.value for item in store.read_log(session, "chat")],
        [event.op for event in store.log_history(session, "chat")],
        latest.checkpoint["id"],
        latest.pending_writes,
        [t.checkpoint["id"] for t in saver.list(config(session))],
    )


def gate(alias: str, session: str) -> tuple[str, str] | None:
    found = SessionGate.objects.using(alias).filter(session_id=session)
    return next(iter(found.values_list("state", "peer")), None)


def open_or_none(alias: str, session: str) -> bool:
    return gate(alias, session) in (None, (GateState.OPEN, ""))


def test_a_moved_session_keeps_every_row_and_reads_the_same_from_every_process(sharded):
    session = session_on(sharded, "default")
    fill(sharded, session)
    rows, before = session_rows("default", session), reads(sharded, session)
    assert all(rows[name] for name in ("Memory", "MemoryVersion", "LogItem", "Checkpoint"))

    report = sharded.move(session, "other")

    assert (report.source, report.target) == ("default", "other")
    assert report.rows == sum(len(table) for table in rows.values())
    assert session_rows("other", session) == rows
    assert not any(session_rows("default", session).values())
    assert gate("default", session) == (GateState.MOVED, "other")
    assert open_or_none("other", session)
    assert reads(sharded, session) == before
    fresh = ShardedStore(SHARDS, cache=sharded.stores["default"].cache_alias)
    assert reads(fresh, session) == before  # a process that never saw the move follows its gate
    assert fresh.locate(session) == "other" and fresh.place(session) == "default"
    fresh.remember(session, "plan", {"step": 3})
    assert sharded.recall(session, "plan").version == 4
    assert not any(session_rows("default", session).values())

    back = fresh.move(session, "default")  # home again: its gate there opens

    assert (back.source, back.target) == ("other", "default")
    assert open_or_none("default", session)
    assert gate("other", session) == (GateState.MOVED, "default")
    assert [v.version for v in sharded.history(session, "plan")] == [1, 2, 3, 4]
    assert sharded.move(session, "default").rows == 0  # already there: nothing to do


WRITES = {
    # update(fn): the locked path; remember: PostgreSQL's one statement in autocommit without
    # Redis (the gate passed inside it, migration 0016), the locked path elsewhere.
    "update": lambda store, session: store.update(session, "n", lambda n: n + 1),
    "remember": lambda store, session: store.remember(session, "n", 2),
}


@pytest.mark.parametrize("how", sorted(WRITES))
def test_a_write_during_the_copy_waits_and_lands_on_the_new_shard(sharded, how):
    session = session_on(sharded, "default")
    sharded.remember(session, "n", 1)
    held = hold_next_move(lambda s, _keys: s == session)
    waiting = hold_next_gate_wait(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10), "the move never closed the gate"
    outcome: list = []
    writer = started(lambda: outcome.append(WRITES[how](sharded, session)))
    assert waiting.reached.wait(10), "the write did not meet the closed gate"
    waiting.release()
    held.release()
    mover.join(10)
    writer.join(10)
    assert not mover.is_alive() and not writer.is_alive()
    assert outcome[0].value == 2 and outcome[0].version == 2
    assert sharded.recall(session, "n").value == 2
    assert [v.version for v in sharded.history(session, "n")] == [1, 2]
    assert session_rows("other", session)["MemoryVersion"] and not any(
        session_rows("default", session).values()
    )


@pytest.mark.parametrize("how", sorted(WRITES))
def test_without_the_gate_a_write_during_the_copy_is_lost(how):
    """The declared defect: writes skip the gate. The same write, during the same copy, is
    acknowledged and lost -- what the gate exists to prevent."""
    sharded = ShardedStore(SHARDS, cache=None, defects=[Defect.UNGATED_WRITES])
    session = session_on(sharded, "default")
    sharded.remember(session, "n", 1)
    held = hold_next_move(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10)
    acknowledged = WRITES[how](sharded, session)  # does not wait
    held.release()
    mover.join(10)
    assert acknowledged.version == 2
    assert sharded.recall(session, "n").value == 1  # the acknowledged write is gone


def test_writers_racing_many_moves_lose_and_double_nothing(sharded):
    session = session_on(sharded, "default", stem="busy")
    writers, each = 3, 25
    errors: list[BaseException] = []
    progress = threading.Condition()
    written, moved = [0], [0]

    def write(number: int) -> None:
        try:
            for i in range(each):
                seen = moved[0]
                sharded.update(session, "n", lambda n: (n or 0) + 1)
                sharded.append(session, "items", [f"{number}-{i}"])
                with progress:
                    written[0] += 1
                    progress.notify_all()
                    if i % 5 == 4:  # a move between each five writes: every writer meets many
                        progress.wait_for(lambda seen=seen: moved[0] > seen, timeout=30)
        except BaseException as error:
            errors.append(error)
        finally:
            with progress:
                progress.notify_all()

    threads = [started(write, n) for n in range(writers)]
    # A move after each write that landed since the one before (a mover moving back to back
    # starves every writer), for as long as the writers write.
    while any(thread.is_alive() for thread in threads):
        seen = written[0]
        sharded.move(session, elsewhere(sharded.locate(session)))
        with progress:
            moved[0] += 1
            progress.notify_all()
            progress.wait_for(
                lambda seen=seen: (
                    written[0] > seen or not any(thread.is_alive() for thread in threads)
                ),
                timeout=30,
            )
    for thread in threads:
        thread.join(30)
    assert moved[0] >= each // 5
    assert not errors, errors
    total = writers * each
    assert sharded.recall(session, "n").value == total
    assert [v.version for v in sharded.history(session, "n", limit=1000)] == list(
        range(total, 0, -1)
    ) or [v.version for v in sharded.history(session, "n", limit=1000)] == list(range(1, total + 1))
    items = [item.value for item in sharded.read_log(session, "items", limit=1000)]
    assert sorted(items) == sorted(f"{n}-{i}" for n in range(writers) for i in range(each))
    here = sharded.locate(session)
    assert not any(session_rows(elsewhere(here), session).values())


def test_a_shards_own_store_says_where_a_moved_session_went_and_writes_nothing(sharded):
    session = session_on(sharded, "default")
    sharded.remember(session, "plan", "a")
    sharded.move(session, "other")
    with pytest.raises(SessionMoved) as raised:
        sharded.stores["default"].remember(session, "plan", "b")
    assert (raised.value.session_id, raised.value.left, raised.value.shard) == (
        session,
        "default",
        "other",
    )
    assert not any(session_rows("default", session).values())
    assert sharded.recall(session, "plan").value == "a"


def test_ids_that_differ_in_case_accents_or_spaces_are_other_sessions_and_stay(sharded):
    session = "Zoë"
    twins = ["zoë", "Zoe\u0308".replace("e\u0308", "e"), "Zoë ", "ZOË"]
    for name in [session, *twins]:
        sharded.remember(name, "who", name)
    target = elsewhere(sharded.locate(session))
    sharded.move(session, target)
    assert sharded.locate(session) == target
    for name in twins:
        assert sharded.locate(name) == sharded.place(name)
        assert sharded.recall(name, "who").value == name


def test_an_erase_racing_a_move_leaves_nothing_anywhere(sharded):
    session = session_on(sharded, "default")
    fill(sharded, session)
    held = hold_next_move(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10)
    waiting = hold_next_gate_wait(lambda s, _keys: s == session)
    eraser = started(sharded.erase_session, session)
    assert waiting.reached.wait(10)
    waiting.release()
    held.release()
    mover.join(10)
    eraser.join(10)
    assert sharded.recall(session, "plan") is None
    for alias in SHARDS:
        assert not any(session_rows(alias, session)[name] for name in ("Memory", "MemoryVersion"))


def test_move_refuses_a_shard_that_is_not_one_and_a_bad_session_id(sharded):
    with pytest.raises(InvalidMemory, match="'elsewhere' is not a shard"):
        sharded.move("s", "elsewhere")
    with pytest.raises(InvalidMemory):
        sharded.move(["s"], "other")  # type: ignore[arg-type]
    with pytest.raises(InvalidMemory):
        sharded.move("Zoe\u0308", "other")  # not NFC
    assert not SessionGate.objects.using("default").exists()
    assert not SessionGate.objects.using("other").exists()


# ---------------------------------------------------------------------- the command


@pytest.fixture
def shards_setting(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "SHARDS": SHARDS, "CACHE": None}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("move_sessions", *args, stdout=out)
    return out.getvalue()


def test_the_command_moves_named_sessions_and_says_what_it_did(shards_setting):
    store = ShardedStore(cache=None)
    sessions = [session_on(store, "default", stem=f"s{n}") for n in range(3)]
    for session in sessions:
        store.remember(session, "k", session)
    out = run("--to", "other", *sessions)
    assert f"[1/3] '{sessions[0]}': 'default' -> 'other'" in out
    assert "3 session(s) moved to 'other'" in out
    assert all(ShardedStore(cache=None).locate(s) == "other" for s in sessions)
    assert "already on 'other'" in run("--to", "other", sessions[0])


def test_the_command_moves_a_fraction_of_a_shards_sessions(shards_setting):
    store = ShardedStore(cache=None)
    sessions = [session_on(store, "default", stem=f"f{n}") for n in range(8)]
    for session in sessions:
        store.remember(session, "k", 1)
    out = run("--from", "default", "--fraction", "0.25", "--to", "other")
    assert "2 session(s) moved to 'other'" in out
    assert sum(ShardedStore(cache=None).locate(s) == "other" for s in sessions) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--to ALIAS"),
        (("--to", "nowhere", "s"), "'nowhere' is not a shard"),
        (("--to", "other"), "name the sessions"),
        (("--to", "other", "--from", "default", "--fraction", "0"), "in (0, 1]"),
        (("--to", "other", "--from", "default", "--fraction", "half"), "in (0, 1]"),
        (("--to", "other", "--from", "default"), "go together"),
        (("--to", "other", "--from", "default", "--fraction", "1", "s"), "go together"),
        (("--to", "default", "--from", "default", "--fraction", "1"), "the same shard"),
        (("--resume", "s"), "no other argument"),
        (("--rebalance", "s"), "no other argument"),
        (("--rebalance", "--to", "other"), "no other argument"),
        (("--to", "other", "Zoe\u0308"), "NFC"),
    ],
)
def test_the_command_refuses_bad_arguments_naming_them_and_moves_nothing(
    shards_setting, args, message
):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("]", r"\]")):
        run(*args)
    assert not SessionGate.objects.using("default").exists()


def test_a_mover_that_died_leaves_the_session_readable_and_resume_finishes_it(shards_setting):
    store = ShardedStore(cache=None)
    session = session_on(store, "default")
    fill(store, session)
    before = reads(store, session)
    # What a mover that died after closing the gate leaves (its first step, committed).
    SessionGate.objects.using("default").update_or_create(
        session_id=session, defaults={"state": GateState.MOVING, "peer": "other"}
    )
    assert reads(store, session) == before  # read throughout
    waiting = hold_next_gate_wait(lambda s, _keys: s == session)
    outcome: list = []
    writer = started(lambda: outcome.append(store.remember(session, "plan", {"step": 9})))
    assert waiting.reached.wait(10)
    waiting.release()
    assert "1 unfinished move(s) finished" in run("--resume")
    writer.join(10)
    assert outcome and outcome[0].version == 4
    assert store.locate(session) == "other"
    after = reads(store, session)
    assert after[0] == {"step": 9} and after[1] == [1, 2, 3, 4] and after[2:] == before[2:]
    assert "0 unfinished move(s) finished" in run("--resume")


def test_a_second_move_of_a_session_being_moved_is_refused_and_changes_nothing(sharded):
    session = session_on(sharded, "default")
    sharded.remember(session, "plan", "a")
    held = hold_next_move(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10)
    with pytest.raises(MemoryUnavailable, match="is moving on shard 'default'"):
        sharded.move(session, "other")
    assert gate("default", session) == (GateState.MOVING, "other")
    held.release()
    mover.join(10)
    assert sharded.locate(session) == "other" and sharded.recall(session, "plan").value == "a"


def test_a_search_over_every_shard_lists_a_session_being_moved_once():
    sharded = ShardedStore(
        SHARDS, cache=None, index=Index(embed=HashEmbedder(16), dims=16, fields=["$"])
    )
    session = session_on(sharded, "default")
    sharded.remember(session, "note", "the blue kite")
    held = hold_next_move(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10)  # copied to 'other', not deleted from 'default' yet
    assert all(session_rows(alias, session)["Memory"] for alias in SHARDS)
    hits = sharded.search_sessions("", "blue kite", limit=10)
    held.release()
    mover.join(10)
    assert [(hit.session_id, hit.key) for hit in hits] == [(session, "note")]


# ---------------------------------------------------------------------- memcheck


def test_memcheck_across_shards_with_sessions_moving_finds_no_anomaly_on_the_real_store():
    result = run_across_shards(SHARDS, WorkloadConfig(ops=600))
    assert result.faults_injected.get("session-move", 0) >= 3, result.fault_errors
    assert not result.anomalies, [a.as_dict() for a in result.anomalies[:5]]
    assert result.history.operations
    for alias in SHARDS:  # the run's sessions, threads and gates gone
        assert not SessionGate.objects.using(alias).filter(session_id__startswith="memcheck-")
        assert not any(session_rows(alias, key)["Memory"] for key in ("memcheck-",))


SCRATCH_RUN = """
import django, json
django.setup()
from django.conf import settings
from django.db import connections
from agentmemory.consistency.sharded import SCRATCH_ALIAS, run_across_shards, shards_for_moves
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.models import SessionGate, ShardMap
with shards_for_moves("default") as shards:
    result = run_across_shards(shards, WorkloadConfig(ops=300, workloads=("register",)))
print(json.dumps({
    "shards": shards,
    "moves": result.faults_injected.get("session-move", 0),
    "anomalies": len(result.anomalies),
    "left": [SCRATCH_ALIAS in settings.DATABASES, SCRATCH_ALIAS in connections.settings,
             ShardMap.objects.exists(),
             SessionGate.objects.filter(session_id__startswith="memcheck-").exists()],
}))
"""


def test_a_run_with_moves_on_one_database_uses_a_shard_of_its_own_and_leaves_nothing():
    """Without AGENTMEMORY["SHARDS"], memcheck moves sessions between the database and a SQLite
    shard of its own (what ``--self-test`` does on any database), and leaves nothing behind. In
    a process of its own: the test's database guard refuses an alias made during a test."""
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    env.pop("OTHER_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRATCH_RUN],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shards"] == ["default", SCRATCH_ALIAS]
    assert report["moves"] >= 1 and report["anomalies"] == 0, report
    assert report["left"] == [False, False, False, False], json.dumps(report)


def test_a_database_that_is_a_shard_of_another_list_is_refused_a_scratch_shard():
    record_shards("default", ["default", "elsewhere"])
    with pytest.raises(FaultsUnavailable, match="is a shard of"), shards_for_moves("default"):
        pass


def test_the_status_says_a_move_a_mover_left_unfinished_is_stuck():
    from datetime import timedelta

    from agentmemory import clock
    from agentmemory.health import DEGRADED, status

    assert "moves" not in {check["check"] for check in status("default")["checks"]}
    SessionGate.objects.using("default").create(
        session_id="s", state=GateState.MOVING, peer="other", changed_at=clock.now()
    )
    moving = {c["check"]: c for c in status("default")["checks"]}["moves"]
    assert moving["state"] == "ok" and "1 session(s) being moved" in moving["detail"]
    SessionGate.objects.using("default").update(changed_at=clock.now() - timedelta(minutes=5))
    found = status("default")
    stuck = {c["check"]: c for c in found["checks"]}["moves"]
    assert stuck["state"] == "degraded" and "move_sessions --resume" in stuck["detail"]
    assert found["code"] == DEGRADED


def test_a_checkpoint_put_during_the_copy_waits_and_lands_on_the_new_shard(sharded):
    """PostgreSQL's put in autocommit passes the thread's gate in its one statement; elsewhere
    (and in a transaction) the put's transaction does."""
    thread = session_on(sharded, "default", stem="thread")
    saver = AgentMemorySaver(sharded)
    root = put_step(saver, config(thread), "root")
    held = hold_next_move(lambda s, _keys: s == thread)
    waiting = hold_next_gate_wait(lambda s, _keys: s == thread)
    mover = started(sharded.move, thread, "other")
    assert held.reached.wait(10)
    outcome: list = []
    writer = started(lambda: outcome.append(put_step(saver, root, "next")))
    assert waiting.reached.wait(10), "the put did not meet the closed gate"
    waiting.release()
    held.release()
    mover.join(10)
    writer.join(10)
    assert outcome, "the put did not end"
    latest = saver.get_tuple(config(thread))
    assert latest.checkpoint["id"] == outcome[0]["configurable"]["checkpoint_id"]
    assert len(list(saver.list(config(thread)))) == 2
    assert session_rows("other", thread)["Checkpoint"]
    assert not any(session_rows("default", thread).values())


# ---------------------------------------------------------------------- adding a shard


def test_a_shard_added_forwards_every_session_it_homes_and_rebalance_brings_them_home(
    shards_setting, settings
):
    """The list grows from one shard to two: sessions whose home is now the new shard still
    live on the old one. `agentmemory_shards set` forwards them from their new home, so a
    router with the new list reads every one as it was; `move_sessions --rebalance` then moves
    them home, online. Without the forwards (the list recorded alone, as before this existed),
    those sessions read as empty -- the test shows both."""
    one = ShardedStore(["default"], cache=None)
    record_shards("default", ["default"])
    sessions = [f"grow-{n}" for n in range(12)]
    for session in sessions:
        one.remember(session, "k", session)
    homed = [s for s in sessions if place(s, SHARDS) == "other"]
    assert homed and len(homed) < len(sessions)

    for alias in SHARDS:  # the new list recorded, and nothing else: the homed sessions vanish
        record_shards(alias, SHARDS)
    bare = ShardedStore(SHARDS, cache=None)
    assert [s for s in sessions if bare.recall(s, "k") is None] == homed

    out = io.StringIO()
    call_command("agentmemory_shards", "set", stdout=out)
    assert f"{len(homed)} session(s) forwarded" in out.getvalue()
    two = ShardedStore(SHARDS, cache=None)
    assert all(two.recall(s, "k").value == s for s in sessions)
    two.remember(homed[0], "k2", "written while away from home")
    assert not any(session_rows("other", homed[0]).values())  # written where it lives

    moved = run("--rebalance")
    assert f"{len(homed)} session(s) moved to 'other'" in moved
    fresh = ShardedStore(SHARDS, cache=None)
    assert all(fresh.locate(s) == place(s, SHARDS) for s in sessions)
    assert all(fresh.recall(s, "k").value == s for s in sessions)
    assert fresh.recall(homed[0], "k2").value == "written while away from home"
    assert "0 session(s) moved" in run("--rebalance")
    again = io.StringIO()
    call_command("agentmemory_shards", "set", stdout=again)  # a second set: nothing to forward
    assert "0 session(s) forwarded" in again.getvalue()


def test_a_reindex_during_the_copy_waits_and_the_move_succeeds():
    """New vectors for a session being copied wait for the move (the copy's comparison would
    fail if they landed on the shard it leaves): the move completes, and the reindex, run again
    where the session lives, indexes it there."""
    old = Index(embed=HashEmbedder(16), dims=16, fields=["$"], model="old")
    new = Index(embed=HashEmbedder(16), dims=16, fields=["$"], model="new")
    sharded = ShardedStore(SHARDS, cache=None, index=old)
    session = session_on(sharded, "default")
    sharded.remember(session, "note", "the blue kite")
    held = hold_next_move(lambda s, _keys: s == session)
    mover = started(sharded.move, session, "other")
    assert held.reached.wait(10)
    waiting = hold_next_gate_wait(lambda s, _keys: s == session)
    reindexed: list = []

    def reindex() -> None:
        try:
            reindexed.append(
                ShardedStore(SHARDS, cache=None, index=new).stores["default"].reindex()
            )
        except BaseException as error:
            reindexed.append(error)

    reindexer = started(reindex)
    assert waiting.reached.wait(10), "the reindex did not meet the closed gate"
    waiting.release()
    held.release()
    mover.join(10)
    reindexer.join(10)
    assert sharded.locate(session) == "other"  # the move succeeded
    assert reindexed == [0]  # nothing left to reindex on the shard the session left
    assert ShardedStore(SHARDS, cache=None, index=new).reindex() == 1


def test_a_session_of_large_values_moves_in_statements_under_the_servers_packet_size(sharded):
    """Twenty versions of values of 900 KB: 18 MB of rows, over MariaDB's default 16 MB packet
    -- copied a few rows per statement, never all in one."""
    session = session_on(sharded, "default", stem="big")
    for n in range(20):
        sharded.remember(session, "blob", {"n": n, "text": "x" * 900_000})
    moved = sharded.move(session, "other")
    assert moved.rows == 21  # the memory and its 20 versions
    back = sharded.move(session, "default")  # into this run's backend: the packet that counts
    assert back.rows == 21
    assert sharded.recall(session, "blob").value["n"] == 19
    assert len(sharded.history(session, "blob", limit=100)) == 20


def test_the_same_idempotency_key_with_another_request_is_refused_after_a_move(sharded):
    session = session_on(sharded, "default")
    first = sharded.remember(session, "plan", "a", idempotency_key="req-1")
    sharded.move(session, "other")
    assert sharded.remember(session, "plan", "a", idempotency_key="req-1").version == first.version
    with pytest.raises(IdempotencyKeyReused):
        sharded.remember(session, "plan", "b", idempotency_key="req-1")
    assert sharded.recall(session, "plan").value == "a"
