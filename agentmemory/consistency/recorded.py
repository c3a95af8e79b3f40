"""A run as recorded, so that it can be checked again offline (``memcheck --check FILE``): the
history's operations, then one line holding what the checks compared them with -- the stored
memories and logs, the duplicate rows, what Redis served at quiescence and when it was looked at,
the failovers injected.

The file is the ``--history`` file: one JSON object per line, each operation as recorded, and a
last line ``{"record": "final", ...}``. Checking it again runs the same checks on the same input:
the same anomalies as the run that wrote it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .adk import StoredApp, check_adk
from .checker import Anomaly, cache_divergence, check_history, duplicate_rows
from .checkpoints import StoredChain, check_checkpoints
from .history import History, Operation
from .logs import StoredLog, check_logs
from .pg_failover import Failover
from .state import CachedEntry, StoredKey, StoredVersion

FINAL = "final"


@dataclass
class Final:
    """What the checks compared the history with, at the end of the run."""

    state: dict[tuple[str, str], StoredKey] = field(default_factory=dict)
    duplicates: dict[tuple[str, str], int] = field(default_factory=dict)
    logs: dict[tuple[str, str], StoredLog] = field(default_factory=dict)
    checkpoints: dict[str, StoredChain] = field(default_factory=dict)
    adk: dict[str, StoredApp] = field(default_factory=dict)
    cached: dict[tuple[str, str], CachedEntry | None] = field(default_factory=dict)
    looked_at: float = 0.0  # when Redis was read (POSIX seconds)
    failovers: list[Failover] = field(default_factory=list)

    def anomalies(self, history: History) -> list[Anomaly]:
        """Every check, in the run's order."""
        found = duplicate_rows(self.duplicates)
        found += check_history(history, self.state, self.failovers)
        found += check_logs(history.operations, self.logs, self.failovers)
        found += check_checkpoints(history.operations, self.checkpoints, self.failovers)
        found += check_adk(history.operations, self.adk, self.failovers)
        found += cache_divergence(self.cached, self.state, now=self.looked_at)
        return found

    def as_line(self) -> str:
        def pairs(mapping: dict[tuple[str, str], Any]) -> list[list[Any]]:
            return [
                [session_id, key, asdict(v) if v is not None and not isinstance(v, int) else v]
                for (session_id, key), v in mapping.items()
            ]

        return json.dumps(
            {
                "record": FINAL,
                "state": pairs(self.state),
                "duplicates": pairs(self.duplicates),
                "logs": [
                    [
                        s,
                        k,
                        {
                            **asdict(v),
                            "items": list(v.items.items()),
                            "events": list(v.events.items()),
                        },
                    ]
                    for (s, k), v in self.logs.items()
                ],
                "checkpoints": {t: asdict(c) for t, c in self.checkpoints.items()},
                "adk": {app: asdict(stored) for app, stored in self.adk.items()},
                "cached": pairs(self.cached),
                "looked_at": self.looked_at,
                "failovers": [asdict(f) for f in self.failovers],
            },
            default=str,
        )

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> Final:
        def stored(raw: dict[str, Any]) -> StoredKey:
            versions = [StoredVersion(**v) for v in raw.pop("versions")]
            return StoredKey(**raw, versions=versions)

        def log(raw: dict[str, Any]) -> StoredLog:
            items = {int(seq): tuple(item) for seq, item in raw.pop("items")}
            events = {int(version): tuple(event) for version, event in raw.pop("events")}
            return StoredLog(**raw, items=items, events=events)  # type: ignore[arg-type]

        return cls(
            state={(s, k): stored(v) for s, k, v in line["state"]},
            duplicates={(s, k): v for s, k, v in line["duplicates"]},
            logs={(s, k): log(v) for s, k, v in line["logs"]},
            checkpoints={
                thread: StoredChain(
                    {cid: tuple(row) for cid, row in chain["checkpoints"].items()},  # type: ignore[misc]
                    chain["writes"],
                )
                for thread, chain in line.get("checkpoints", {}).items()
            },
            adk={app: StoredApp(**stored) for app, stored in line.get("adk", {}).items()},
            cached={(s, k): None if v is None else CachedEntry(**v) for s, k, v in line["cached"]},
            looked_at=line["looked_at"],
            failovers=[
                Failover(
                    f["crashed_at"],
                    f["promoted_at"],
                    tuple(f["timelines"]),  # type: ignore[arg-type]
                    f.get("injected", True),
                    f.get("kind", "failover"),
                    f.get("lost_after", 0.0),
                )
                for f in line["failovers"]
            ],
        )


def save(path: str, history: History, final: Final) -> None:
    """The history's operations, a line each, then the final state's line."""
    with open(path, "w", encoding="utf-8") as out:
        for op in history.operations:
            out.write(json.dumps(asdict(op), default=str) + "\n")
        out.write(final.as_line() + "\n")


#: The longest line :func:`load` reads (the final state's line grows with the run's keys): a
#: file without line breaks (``/dev/zero``) is refused, not read into memory whole.
LINE_MAX_BYTES = 512 * 1024 * 1024


def load(path: str | Path) -> tuple[History, Final]:
    """A file :func:`save` wrote. Raises ValueError naming the file, the line and what is wrong
    with it -- for any input: not a regular file, not UTF-8, a line over
    :data:`LINE_MAX_BYTES`, JSON nested deeper than Python can decode, records of the wrong
    shape (OSError only when the file cannot be opened or read)."""
    if Path(path).exists() and not Path(path).is_file():
        raise ValueError(f"{path}: not a regular file (a history memcheck saved with --history)")
    history, final = History(run_id=""), None
    with open(path, "rb") as lines:
        number = 0
        while raw := lines.readline(LINE_MAX_BYTES + 1):
            number += 1
            if len(raw) > LINE_MAX_BYTES:
                raise ValueError(f"{path}, line {number}: longer than {LINE_MAX_BYTES} bytes")
            try:
                data = json.loads(raw.decode("utf-8"))
                if not isinstance(data, dict):
                    raise TypeError(f"a JSON {type(data).__name__}, not an object")
                if data.get("record") == FINAL:
                    final = Final.from_line(data)
                else:
                    history.extend([Operation(**data)])
            except RecursionError:
                raise ValueError(f"{path}, line {number}: JSON nested too deep") from None
            except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
                raise ValueError(f"{path}, line {number}: not a memcheck record ({exc})") from exc
    if final is None:
        raise ValueError(
            f"{path}: no final state (the last line of a history memcheck saved); a history "
            "saved before memcheck recorded it cannot be checked again"
        )
    return history, final
