"""The bug memcheck exists to catch: a read-then-write with no row lock.

``UnlockedMemoryStore`` reads the memory without a lock, leaves the gap an agent's own work (an
LLM call) would leave, then writes what it computed from that read. The version counter is bumped
by the database (``version = version + 1``), so the history stays gap-free and the uniqueness
constraint is never hit -- exactly what makes this bug survive manual checks -- but values computed
from stale reads overwrite newer ones: list appends vanish, two compare-and-set writers with the
same expected version both "win". ``memcheck --unsafe`` runs its workload through this store and
must report those anomalies.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db.models import F

from .. import clock
from ..models import Memory, MemoryState, MemoryVersion, Op
from ..records import MemoryRecord
from ..store import MemoryStore, _Change


class UnlockedMemoryStore(MemoryStore):
    #: Seconds between the unlocked read and the write.
    gap: float = 0.002

    def _write(self, session_id: str, changes: dict[str, _Change]) -> dict[str, Any]:
        seen = {
            key: self._memories().filter(session_id=session_id, key=key).first() for key in changes
        }
        time.sleep(self.gap)

        def attempt(retry: bool) -> dict[str, Any]:
            now = clock.now()
            return {
                key: self._apply_unlocked(session_id, key, changes[key], seen[key], now)
                for key in sorted(changes)
            }

        return self._transaction(attempt)

    def _apply_unlocked(
        self, session_id: str, key: str, change: _Change, seen: Memory | None, now: datetime
    ) -> Any:
        if seen is not None and change.caller_request_id:
            done = self._find_request(seen, change.request_id)
            if done is not None:
                return done
        live = seen is not None and seen.state == MemoryState.LIVE
        self._check_cas(session_id, key, change, actual=seen.version if live and seen else 0)
        if change.op in (Op.FORGET, Op.EXPIRE):
            value, state, expires_at = None, MemoryState.FORGOTTEN, None
        else:
            value = change.compute(seen.value if live and seen else change.default)
            state, expires_at = MemoryState.LIVE, self._expires_at(change, now)
        if seen is None:
            self._insert_placeholder(session_id, key, now)
        rows = self._memories().filter(session_id=session_id, key=key)
        rows.update(
            value=value,
            version=F("version") + 1,
            state=state,
            updated_at=now,
            expires_at=expires_at,
        )
        row = rows.get()
        MemoryVersion.objects.using(self.using).create(
            memory=row,
            version=row.version,
            op=change.op,
            value=value,
            created_at=now,
            expires_at=expires_at,
            request_id=change.request_id,
        )
        if change.op in (Op.FORGET, Op.EXPIRE):
            return True
        return MemoryRecord(session_id, key, value, row.version, row.created_at, now, expires_at)
