"""A Hypothesis state machine drives the store -- remember, CAS, update, forget, revert, recall,
history, and time moving on through the store's clock -- against a plain Python model of the
contract, and checks that they agree after every step. On every backend, with and without the
Redis tier (the ``store`` fixture's two params)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from agentmemory import clock
from agentmemory.errors import InvalidMemory, VersionConflict
from agentmemory.testing.strategies import json_values

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = st.sampled_from(["a", "b", "a%"])
TTLS = st.sampled_from([None, None, 10, 100])


@dataclass
class Key:
    """The model of one key: its versions as (op, value), and the live memory if any."""

    versions: list[tuple[str, Any]] = field(default_factory=list)
    live: bool = False
    value: Any = None
    expires_at: datetime | None = None

    @property
    def version(self) -> int:
        return len(self.versions)

    def expire_if_due(self) -> None:
        if self.live and self.expires_at is not None and self.expires_at <= clock.now():
            self.versions.append(("expire", None))
            self.live = False

    def current(self) -> int:
        """The version a CAS compares with: the live version, or 0 when there is none."""
        return self.version if self.live else 0

    def visible(self) -> bool:
        return self.live and (self.expires_at is None or self.expires_at > clock.now())


def make_machine(store: Any) -> type[RuleBasedStateMachine]:
    class StoreVersusModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.session = f"model-{uuid.uuid4().hex[:12]}"
            self.model: dict[str, Key] = {}

        def key(self, name: str) -> Key:
            return self.model.setdefault(name, Key())

        def teardown(self) -> None:
            store.erase_session(self.session)
            clock.reset()

        def wrote(self, name: str, op: str, value: Any, record: Any) -> None:
            model = self.key(name)
            model.versions.append((op, value))
            model.live, model.value, model.expires_at = True, value, record.expires_at
            assert (record.version, record.value) == (model.version, value)

        @rule(name=KEYS, value=json_values(max_leaves=4), ttl=TTLS)
        def remember(self, name: str, value: Any, ttl: int | None) -> None:
            self.key(name).expire_if_due()
            record = store.remember(self.session, name, value, ttl=ttl)
            self.wrote(name, "write", value, record)
            if ttl is not None:
                assert record.expires_at is not None

        @rule(name=KEYS, value=json_values(max_leaves=2), stale=st.integers(0, 2))
        def compare_and_set(self, name: str, value: Any, stale: int) -> None:
            model = self.key(name)
            model.expire_if_due()
            expected = max(0, model.current() - stale)
            try:
                record = store.remember(self.session, name, value, expected_version=expected)
            except VersionConflict as conflict:
                assert expected != model.current()
                assert conflict.actual == model.current()
            else:
                assert expected == model.current()
                self.wrote(name, "write", value, record)

        @rule(name=KEYS)
        def update_counter(self, name: str) -> None:
            model = self.key(name)
            model.expire_if_due()
            before = model.value if model.live else None
            # Any stored value counts: a counter that is not an int yet (Hypothesis wrote
            # {"n": None} once) starts again at 1.
            bump = lambda v: (
                {"n": v["n"] + 1}
                if isinstance(v, dict)
                and isinstance(v.get("n"), int)
                and not isinstance(v["n"], bool)
                else {"n": 1}
            )
            record = store.update(self.session, name, bump, default=None)
            self.wrote(name, "write", bump(before), record)

        @rule(name=KEYS)
        def forget(self, name: str) -> None:
            model = self.key(name)
            model.expire_if_due()
            forgot = store.forget(self.session, name)
            assert forgot == model.live
            if model.live:
                model.versions.append(("forget", None))
                model.live = False

        @rule(name=KEYS, back=st.integers(1, 4))
        def revert(self, name: str, back: int) -> None:
            model = self.key(name)
            target = model.version - back + 1
            if target < 1 or model.versions[target - 1][0] not in ("write", "revert"):
                with pytest.raises(InvalidMemory):
                    store.revert(self.session, name, target)
                return  # refused: nothing changed, not even the expiry
            model.expire_if_due()
            value = model.versions[target - 1][1]
            record = store.revert(self.session, name, target)
            self.wrote(name, "revert", value, record)

        @rule(seconds=st.sampled_from([1, 30, 200]))
        def time_passes(self, seconds: int) -> None:
            clock.advance(timedelta(seconds=seconds))

        @rule(name=KEYS)
        def recall(self, name: str) -> None:
            model = self.key(name)
            found = store.recall(self.session, name)
            if model.visible():
                assert found is not None and (found.version, found.value) == (
                    model.version,
                    model.value,
                )
            else:
                assert found is None

        @invariant()
        def agree(self) -> None:
            visible = {n: (m.version, m.value) for n, m in self.model.items() if m.visible()}
            found = store.recall_many(self.session, list(self.model))
            assert {k: (r.version, r.value) for k, r in found.items()} == visible
            for name, model in self.model.items():
                history = [(v.op, v.value) for v in store.history(self.session, name)]
                assert history == model.versions, name

    return StoreVersusModel


def test_the_store_agrees_with_the_model(store):
    run_state_machine_as_test(
        make_machine(store),
        settings=settings(
            max_examples=20,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
