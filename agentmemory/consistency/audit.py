"""Read-only audit of the data already stored: the invariants any history must satisfy."""

from __future__ import annotations

from django.db.models import Count

from ..models import Memory
from .checker import Anomaly, audit_key, duplicate_rows, load_state

BATCH = 500


def audit(using: str, session_id: str | None = None) -> tuple[int, list[Anomaly]]:
    """Check every memory (or one session's): contiguous versions, live row == newest version,
    one row per key. Returns (memories audited, anomalies)."""
    rows = Memory.objects.using(using)
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    sessions = list(
        rows.values_list("session_id", flat=True).annotate(n=Count("id")).order_by("session_id")
    )
    anomalies: list[Anomaly] = []
    audited = 0
    for start in range(0, len(sessions), BATCH):
        chunk = sessions[start : start + BATCH]
        anomalies += duplicate_rows(using, chunk)
        for (sid, key), stored in sorted(load_state(using, chunk).items()):
            audited += 1
            anomalies += audit_key(sid, key, stored)
    return audited, anomalies
