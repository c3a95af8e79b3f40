"""Before/after ratios of two benchmark reports (``bench/run.py`` JSON), as a markdown table:

    .venv/bin/python bench/compare.py docs/benchmarks-0.4.0.json docs/benchmarks.json

Only ratios compare across runs (this machine's raw baselines move between runs). A figure whose
baseline changed between the reports is shown against each report's own baseline, labelled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def ratios(report: dict[str, Any]) -> dict[tuple[str, bool, str], dict[str, float]]:
    found = {}
    for row in report["figures"]:
        if "ops_per_s" in row:
            key = (row["backend"], row["redis"], row["figure"])
            found[key] = {label: base["ratio"] for label, base in row["baselines"].items()}
    return found


def table(before: dict[str, Any], after: dict[str, Any]) -> str:
    old, new = ratios(before), ratios(after)
    lines = [
        "| backend | Redis | figure | baseline | before | after |",
        "|---|---|---|---|---|---|",
    ]
    for key, now in new.items():
        backend, redis, figure = key
        then = old.get(key, {})
        for label, ratio in now.items():
            if label in then:
                was, shown = f"{then[label]:.2f}", label
            elif then:
                ((was_label, was_ratio),) = list(then.items())[:1]
                was, shown = f"{was_ratio:.2f} (vs {was_label})", label
            else:
                was, shown = "--", label
            lines.append(
                f"| {backend} | {'on' if redis else 'off'} | {figure} | {shown} | {was} | "
                f"{ratio:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    before, after = (json.loads(Path(p).read_text()) for p in sys.argv[1:])
    print(table(before, after))


if __name__ == "__main__":
    main()
