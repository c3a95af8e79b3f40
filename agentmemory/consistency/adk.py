"""memcheck's ADK workload: Google ADK's session service (``AgentMemorySessionService``) as ADK's
``Runner`` calls it, on sessions ``adk-N`` of an app named after memcheck's session.

Each call loads the session (``get_session``; ``create_session`` first when there is none --
clients race to create it, and the losers get ``AlreadyExistsError``) and then:

- ``adk-append``: after a short turn (the model's call), appends one event (its id: the op id)
  whose ``state_delta`` sets -- as an agent counts its turns -- ``n`` to one more than the loaded
  session's ``n`` (a read-modify-write: an append onto a stale session loses an increment,
  google/adk-python #4751), up to two of the keys ``s0``/``s1``, ``app:a0``, ``user:u0`` (the op
  id as the value), and a ``temp:`` key that must never be stored. A quarter are sent twice, as after a timeout: the
  same event, stored once. ADK's ``StaleSessionError`` is a refusal (nothing may be written).
- ``adk-get``: the session's events and state as ``get_session`` returns them (None: no
  session yet).

The checks (:func:`check_adk`) compare the calls with what the database holds: each session's
events log, and every state key's history of versions:

- ``adk-event``: every acknowledged append is stored once, a refused one not at all, every stored
  event was appended by a call that was not refused, and the log keeps the order in which the
  appends were acknowledged;
- ``adk-state``: the state is the fold of the stored events -- each event's change of a key is
  one version of that key, in the order of the events (a session's own keys: the log's order),
  the live value is the newest, ``n`` counts 1, 2, 3, ... with no increment lost, and no
  ``temp:`` key is stored;
- ``adk-read``: a ``get_session`` returns a prefix of the stored log holding every event
  acknowledged before it began, and a state that is the fold of a prefix of those events (the
  state is read before the events), with ``app:``/``user:`` values not older than one
  acknowledged before it began.

After a database failover, an acknowledged append the database lost is ``lost-by-database``, and
reads that began before the promotion are not judged.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..store import MemoryStore
from .checker import Anomaly, brief
from .history import ADK_KINDS as KINDS
from .history import Operation

__all__ = [
    "KINDS",
    "StaleAppend",
    "StoredApp",
    "check_adk",
    "delete_apps",
    "load_apps",
    "run_op",
]

#: The user every ADK session of the workload belongs to.
USER = "memcheck"
#: The session-scoped keys an event may set (besides ``n``), and the shared ones.
SESSION_KEYS = ("s0", "s1")
SHARED_KEYS = ("app:a0", "user:u0")
#: The counter each append may increment (a read-modify-write of the loaded state).
COUNTER = "n"
#: A key ADK keeps in memory only: never stored.
TEMP_KEY = "temp:t"
#: An agent's turn between loading the session and appending its event lasts up to this many
#: seconds (the model's call: here short, so that turns on one session still meet).
THINK_SECONDS = 0.005
#: The share of appends sent a second time (the same event, as after a timeout).
TWICE = 0.25
MUTATIONS = frozenset({"adk-append"})


class StaleAppend(Exception):
    """ADK's ``StaleSessionError``: the append was refused, nothing was written."""


def choose_kind(rng: random.Random) -> str:
    return "adk-append" if rng.random() < 0.6 else "adk-get"


def run_op(store: MemoryStore, rng: random.Random, op: Operation, call: Any) -> Operation:
    """One call of the ADK workload on ``store``, recorded into ``op`` (``call``: the workload's
    recorder): the session loaded (created first if need be), then an event appended, or the
    loaded session recorded."""
    from google.adk.errors import StaleSessionError
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    from ..integrations.adk import AgentMemorySessionService

    service = AgentMemorySessionService(store)
    app, sid = op.session_id, op.key
    names = [COUNTER, *rng.sample([*SESSION_KEYS, *SHARED_KEYS], rng.choice((0, 1, 2)))]
    twice = rng.random() < TWICE
    thinking = rng.uniform(0, THINK_SECONDS)

    async def load(create: bool) -> Any:
        from google.adk.errors.already_exists_error import AlreadyExistsError

        session = await service.get_session(app_name=app, user_id=USER, session_id=sid)
        if session is None and create:
            try:
                session = await service.create_session(app_name=app, user_id=USER, session_id=sid)
            except AlreadyExistsError:
                session = await service.get_session(app_name=app, user_id=USER, session_id=sid)
        return session

    if op.kind == "adk-append":

        async def append() -> None:
            session = await load(create=True)
            await asyncio.sleep(thinking)  # the model's turn, between the load and the append
            delta: dict[str, Any] = {TEMP_KEY: op.id}
            for name in names:
                value: dict[str, Any] = {"op": op.id}
                if name == COUNTER:
                    value["n"] = (session.state.get(COUNTER) or {}).get("n", 0) + 1
                delta[name] = value
            op.value = {"op": op.id, "delta": {k: v for k, v in delta.items() if k != TEMP_KEY}}
            event = Event(
                id=op.id,
                invocation_id=op.id,
                author="memcheck",
                actions=EventActions(state_delta=delta),
            )
            try:
                await service.append_event(session, event)
                if twice:
                    await service.append_event(session, event)
            except StaleSessionError as exc:
                raise StaleAppend(str(exc)) from None

        call(op, lambda: asyncio.run(append()))
    else:

        async def get() -> dict[str, Any] | None:
            session = await load(create=False)
            if session is None:
                return None
            return {
                "events": [event.id for event in session.events],
                "state": {
                    name: value.get("op") if isinstance(value, dict) else value
                    for name, value in session.state.items()
                },
            }

        call(op, lambda: asyncio.run(get()))
    return op


# ---------------------------------------------------------------------------- what was stored


@dataclass
class StoredApp:
    """What the database holds of one app (one memcheck session): each ADK session's events (their
    ids, in the log's order), and each state key's versions (their op ids, oldest first) with the
    live value's, keyed by slot (:func:`slot`). ``counts``: ``n``'s values, by slot."""

    events: dict[str, list[str]] = field(default_factory=dict)
    versions: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)
    live: dict[str, str | None] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)


def slot(sid: str, name: str) -> str:
    """A state key's place: ``app:``/``user:`` keys are the app's or the user's (one for every
    session of the app), the others the session's own (``<sid> <name>``)."""
    return name if name.startswith(("app:", "user:")) else f"{sid} {name}"


def load_apps(using: str, apps: Iterable[str], sids: Iterable[str]) -> dict[str, StoredApp]:
    """What the database holds of these apps' sessions ``sids`` (read-only)."""
    from ..integrations.adk import EVENTS, _app, _session, _user
    from ..models import LogItem
    from .state import load_state

    sids = list(sids)
    found: dict[str, StoredApp] = {}
    for app in apps:
        stored = StoredApp()
        owners = {_app(app): "app:", _user(app, USER): "user:"}
        for sid in sids:
            owner = _session(app, USER, sid)
            owners[owner] = sid
            items = (
                LogItem.objects.using(using)
                .filter(log__session_id=owner, log__stream=EVENTS, removed_in__isnull=True)
                .order_by("seq")
                .values_list("value", flat=True)
            )
            stored.events[sid] = [value.get("id") for value in items]
        for (owner, name), key in load_state(using, owners).items():
            scope = owners[owner]
            where = scope + name if scope.endswith(":") else slot(scope, name)
            stored.versions[where] = [_token(v.value) for v in key.versions]
            stored.counts[where] = [
                v.value.get("n", 0) for v in key.versions if isinstance(v.value, dict)
            ]
            newest = max(key.versions, key=lambda v: v.version, default=None)
            live = newest is not None and newest.version == key.live_version
            stored.live[where] = _token(newest.value) if live and newest else None
            if key.kept_from > 1:
                stored.pruned[where] = key.kept_from - 1
        found[app] = stored
    return found


def delete_apps(store: MemoryStore, apps: Iterable[str], sids: Iterable[str]) -> None:
    """Erase what the workload wrote for these apps: each session's head, events and state,
    and the app's and the user's state."""
    from ..integrations.adk import _app, _listing, _session, _user

    sids = list(sids)
    for app in apps:
        for owner in [_listing(app), _app(app), _user(app, USER)]:
            store.erase_session(owner)
        for sid in sids:
            store.erase_session(_session(app, USER, sid))


def _token(value: Any) -> str:
    return str(value.get("op")) if isinstance(value, dict) else str(value)


# ---------------------------------------------------------------------------- the checks


@dataclass
class _App:
    app: str
    ops: list[Operation]
    stored: StoredApp
    promoted: float
    found: list[Anomaly] = field(default_factory=list)
    #: The appends by event id, and what state each asked to change.
    appends: dict[str, Operation] = field(init=False)
    deltas: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.appends = {op.id: op for op in self.ops if op.kind == "adk-append"}
        self.deltas = {
            op.id: (op.value or {}).get("delta", {}) for op in self.appends.values() if op.value
        }

    def acknowledged_before(self, event_id: str, op: Operation) -> bool:
        """Whether the append of ``event_id`` was acknowledged before ``op`` began."""
        append = self.appends.get(event_id)
        return (
            append is not None
            and append.status == "ok"
            and (append.completed_at or 0) < op.invoked_at
        )

    def report(self, check: str, key: str, message: str, *involved: Operation) -> None:
        """An anomaly of ``key`` (a session, or a state key's slot): of the ADK session of its
        first operation, if it has any -- the report draws that session's calls around it."""
        key = involved[0].key if involved else key
        self.found.append(Anomaly(check, self.app, key, message, [brief(op) for op in involved]))

    def judged(self, op: Operation) -> bool:
        """Whether a read is judged: it began after the last failover's promotion."""
        return op.invoked_at > self.promoted


def check_adk(
    history: Iterable[Operation], apps: dict[str, StoredApp], failovers: Any = ()
) -> list[Anomaly]:
    """Every ADK check over the history's ADK calls and what the database holds."""
    promoted = max((f.promoted_at for f in failovers), default=float("-inf"))
    by_app: dict[str, list[Operation]] = defaultdict(list)
    for op in sorted(history, key=lambda o: o.invoked_at):
        if op.kind in KINDS:
            by_app[op.session_id].append(op)
    found: list[Anomaly] = []
    for app in sorted(by_app):
        a = _App(app, by_app[app], apps.get(app, StoredApp()), promoted)
        for op in a.ops:
            if op.status == "info" and not (op.error or "").startswith("MemoryUnavailable"):
                a.report("caller-error", op.key, f"{op.kind} raised {op.error}", op)
        _check_events(a)
        _check_state(a)
        _check_reads(a)
        found += a.found
    return found


def _check_events(a: _App) -> None:
    appends = a.appends
    for sid in sorted({op.key for op in a.ops}):
        stored = a.stored.events.get(sid, [])
        position = {}
        for index, event_id in enumerate(stored):
            if event_id in position:
                a.report("adk-event", sid, f"event {event_id} is stored twice", appends[event_id])
                continue
            position[event_id] = index
            op = appends.get(event_id)
            if op is None or op.key != sid:
                a.report("adk-event", sid, f"event {event_id} was appended by no call")
            elif op.status == "fail":
                a.report(
                    "adk-event", sid, f"append_event {event_id} was refused but it is stored", op
                )
        mine = [op for op in appends.values() if op.key == sid]
        for op in mine:
            if op.status == "ok" and op.id not in position:
                check = "lost-by-database" if op.invoked_at <= a.promoted else "adk-event"
                a.report(check, sid, f"acknowledged append_event {op.id} is not stored", op)
        # The log keeps the order the appends were acknowledged in: no event is stored before
        # one that was acknowledged before it began.
        began_last: Operation | None = None  # of the events stored so far, the last to begin
        for op in sorted(
            (op for op in mine if op.status == "ok" and op.id in position),
            key=lambda op: position[op.id],
        ):
            if began_last is not None and began_last.invoked_at > (op.completed_at or 0):
                a.report(
                    "adk-event",
                    sid,
                    f"event {began_last.id} is stored before {op.id}, which was acknowledged "
                    "before it began",
                    began_last,
                    op,
                )
            if began_last is None or op.invoked_at > began_last.invoked_at:
                began_last = op


def _check_state(a: _App) -> None:
    appends, deltas = a.appends, a.deltas
    # What the stored events set, slot by slot, in the order the fold applies them: a session's
    # own keys in its log's order; the shared ones per session in its log's order.
    setters: dict[str, list[str]] = defaultdict(list)
    for sid, events in sorted(a.stored.events.items()):
        for event_id in events:
            for name in deltas.get(event_id, {}):
                setters[slot(sid, name)].append(event_id)
    for where in sorted(set(setters) | set(a.stored.versions)):
        versions = a.stored.versions.get(where, [])
        expected = setters.get(where, [])
        if where.endswith(" " + TEMP_KEY.removeprefix("temp:")) or "temp:" in where:
            a.report("adk-state", where, f"{where} is stored: temp: state never is")
            continue
        pruned = a.stored.pruned.get(where, 0)
        for event_id in sorted(set(expected) - set(versions)):
            if pruned and expected.index(event_id) < pruned:
                continue  # its version was pruned by the retention policy
            a.report(
                "adk-state",
                where,
                f"event {event_id} set {where}, and no version of it holds that change",
                *([appends[event_id]] if event_id in appends else []),
            )
        for token in sorted(set(versions) - set(expected)):
            op = appends.get(token)
            a.report(
                "adk-state",
                where,
                f"{where} holds {token}, a change of no stored event"
                + (f" (its append_event {op.status})" if op else ""),
                *([op] if op else []),
            )
        for token in sorted({t for t in versions if versions.count(t) > 1}):
            a.report("adk-state", where, f"{where} holds {token}'s change {versions.count(token)}x")
        if set(versions) == set(expected) and len(versions) == len(expected):
            if where.startswith(("app:", "user:")):
                for sid, events in a.stored.events.items():
                    mine = [t for t in versions if t in events]
                    if mine != [e for e in events if e in mine]:
                        a.report(
                            "adk-state",
                            where,
                            f"{where}'s versions of session {sid}'s events are not in its "
                            f"log's order: {mine}",
                        )
            elif versions != expected[pruned:] and versions != expected:
                a.report(
                    "adk-state",
                    where,
                    f"{where}'s versions are not in the order of the events that set it "
                    f"({versions[:5]}..., the log: {expected[:5]}...)",
                )
        live = a.stored.live.get(where)
        if versions and live != versions[-1]:
            a.report("adk-state", where, f"{where} is {live}, its newest version {versions[-1]}")
        if where.endswith(" " + COUNTER):
            counts = a.stored.counts.get(where, [])
            for index, count in enumerate(counts):
                if count != pruned + index + 1:
                    op = appends.get(versions[index])
                    # After a failover, a session loaded from the old primary may carry a
                    # revision the new one reached again with other events: the database's loss.
                    lost = op is not None and op.invoked_at <= a.promoted
                    a.report(
                        "lost-by-database" if lost else "adk-state",
                        where,
                        f"{where} went {counts[index - 1] if index else '-'} -> {count} "
                        f"(version {index + 1 + pruned}, {versions[index]}): an increment made "
                        "on a stale session was acknowledged",
                        *([op] if op else []),
                    )
                    break


def _fold(events: list[str], deltas: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The session's own keys after these events (which event set each last)."""
    state: dict[str, str] = {}
    for event_id in events:
        for name in deltas.get(event_id, {}):
            if not name.startswith(("app:", "user:")):
                state[name] = event_id
    return state


def _check_reads(a: _App) -> None:
    appends, deltas = a.appends, a.deltas
    for op in a.ops:
        if op.kind != "adk-get" or op.status != "ok" or not a.judged(op):
            continue
        sid = op.key
        stored = a.stored.events.get(sid, [])
        if op.result is None:  # no such session yet: none of its appends may be acknowledged
            done = [e for e in stored if a.acknowledged_before(e, op)]
            if done:
                a.report(
                    "adk-read",
                    sid,
                    f"get_session found no session, and event {done[0]} was appended to it "
                    "before it began",
                    op,
                    appends[done[0]],
                )
            continue
        events = list(op.result["events"])
        state = dict(op.result["state"])
        if events != stored[: len(events)]:
            a.report(
                "adk-read",
                sid,
                f"get_session returned events {events[-5:]}, not a prefix of the stored log",
                op,
            )
            continue
        before = [e for e in stored if a.acknowledged_before(e, op)]
        missing = [e for e in before if e not in events]
        if missing:
            a.report(
                "adk-read",
                sid,
                f"get_session left out event {missing[0]}, acknowledged before it began",
                op,
                appends[missing[0]],
            )
            continue
        own = {
            name: token for name, token in state.items() if not name.startswith(("app:", "user:"))
        }
        floor = max((events.index(e) + 1 for e in before), default=0)
        if not any(_fold(events[:p], deltas) == own for p in range(floor, len(events) + 1)):
            a.report(
                "adk-read",
                sid,
                f"get_session returned state {own}, the fold of no prefix of its events "
                f"holding every one acknowledged before it began",
                op,
            )
        for name in SHARED_KEYS:
            versions = a.stored.versions.get(name, [])
            got = state.get(name)
            newest_before = max(
                (versions.index(e) for e in versions if a.acknowledged_before(e, op)),
                default=-1,
            )
            index = versions.index(got) if got in versions else -1
            if got is not None and index < 0:
                a.report("adk-read", sid, f"get_session returned {name} = {got}, never stored", op)
            elif index < newest_before:
                a.report(
                    "adk-read",
                    sid,
                    f"get_session returned {name} = {got}, older than {versions[newest_before]} "
                    "acknowledged before it began",
                    op,
                )
