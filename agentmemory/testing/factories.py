"""factory-boy factories that build memories the way the store would have written them.

    MemoryFactory(session_id="s", key="k", value={"a": 1}, versions=3)   # live row + history 1..3
    MemoryVersionFactory(memory=m, value={"a": 2})                       # appends version 4
    MemoryFactory(versions=3, gap=True)                                  # history 1, 3, 4: for audits

They never produce data that breaks the contract unless a trait asks for it (``gap``): session ids
and keys pass the store's validation, values must be JSON, versions are 1..N with the live row at
the newest one. They write to the database directly (no cache update): use them to set up a test,
not to stand in for the store under test.
"""

from __future__ import annotations

import uuid
from typing import Any

import factory
from factory.django import DjangoModelFactory

from .. import clock, validation
from ..models import Memory, MemoryState, MemoryVersion, Op

__all__ = ["MemoryFactory", "MemoryVersionFactory"]

_STATE_AFTER = {Op.FORGET: MemoryState.FORGOTTEN, Op.EXPIRE: MemoryState.EXPIRED}


def _checked_value(value: Any) -> Any:
    validation.encode_value(value, 1 << 30)  # JSON only; the size limit is the store's setting
    return value


class MemoryFactory(DjangoModelFactory):
    """A memory with ``versions`` versions (default 1). Versions before the last hold
    ``{"version": n}``; the last holds ``value``. ``versions=0`` makes the version-0 placeholder
    row a first write would lock (no history, not live)."""

    class Meta:
        model = Memory

    class Params:
        #: Plant a gap for audit tests: version 2 is left out of the history.
        gap = factory.Trait(missing=(2,))

    session_id = factory.Sequence(lambda n: f"session-{n}")
    key = factory.Sequence(lambda n: f"key-{n}")
    value = factory.Sequence(lambda n: {"note": f"memory {n}"})
    created_at = factory.LazyFunction(clock.now)
    updated_at = factory.SelfAttribute("created_at")
    expires_at = None
    versions = 1
    missing: tuple[int, ...] = ()

    @classmethod
    def _create(cls, model_class: type[Memory], *args: Any, **kwargs: Any) -> Memory:
        versions, missing = kwargs.pop("versions"), tuple(kwargs.pop("missing"))
        if isinstance(versions, bool) or not isinstance(versions, int) or versions < 0:
            raise ValueError(f"versions must be an int >= 0, got {versions!r}")
        validation.check_session_id(kwargs["session_id"])
        validation.check_key(kwargs["key"])
        _checked_value(kwargs["value"])
        numbers = [n for n in range(1, versions + len(missing) + 1) if n not in missing]
        numbers = numbers[:versions]
        manager = cls._get_manager(model_class)
        memory = manager.create(
            *args,
            **{
                **kwargs,
                "version": numbers[-1] if numbers else 0,
                "state": MemoryState.LIVE if numbers else MemoryState.FORGOTTEN,
                "value": kwargs["value"] if numbers else None,
            },
        )
        MemoryVersion.objects.using(memory._state.db).bulk_create(
            MemoryVersion(
                memory=memory,
                version=n,
                op=Op.WRITE,
                value=kwargs["value"] if n == numbers[-1] else {"version": n},
                created_at=memory.created_at,
                expires_at=memory.expires_at if n == numbers[-1] else None,
                request_id=uuid.uuid4().hex,
            )
            for n in numbers
        )
        return memory

    @classmethod
    def _build(cls, model_class: type[Memory], *args: Any, **kwargs: Any) -> Memory:
        kwargs.pop("versions"), kwargs.pop("missing")
        return model_class(*args, **kwargs)


class MemoryVersionFactory(DjangoModelFactory):
    """The next version of ``memory`` (a new memory if none is given), with the live row moved to
    it -- as the store's one write path would. ``op`` is ``"write"`` by default; ``"forget"`` and
    ``"expire"`` retire the live row."""

    class Meta:
        model = MemoryVersion

    memory = factory.SubFactory(MemoryFactory, versions=0)
    op = Op.WRITE
    value = factory.Sequence(lambda n: {"note": f"version {n}"})
    created_at = factory.LazyFunction(clock.now)
    expires_at = None
    request_id = factory.LazyFunction(lambda: uuid.uuid4().hex)

    @classmethod
    def _create(cls, model_class: type[MemoryVersion], *args: Any, **kwargs: Any) -> MemoryVersion:
        memory: Memory = kwargs["memory"]
        op = kwargs["op"]
        if op not in set(Op):
            raise ValueError(f"op must be one of {', '.join(Op)}, got {op!r}")
        value = None if op in _STATE_AFTER else _checked_value(kwargs["value"])
        memory.version += 1
        memory.value = value
        memory.state = _STATE_AFTER.get(op, MemoryState.LIVE)
        memory.updated_at = kwargs["created_at"]
        memory.expires_at = kwargs["expires_at"]
        memory.save(update_fields=["version", "value", "state", "updated_at", "expires_at"])
        manager = cls._get_manager(model_class)
        return manager.create(*args, **{**kwargs, "version": memory.version, "value": value})
