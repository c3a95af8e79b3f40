"""Where the suite's time goes: each backend's JUnit report (scripts/test.sh writes
out/junit/BACKEND.xml) summed by test file, the longest first.

Usage: python scripts/suite_times.py [out/junit] [--top N]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def by_file(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "?").split(".")
        name = "/".join(part for part in module if not part[:1].isupper()) + ".py"
        seconds[name] += float(case.get("time", 0))
    return seconds


def main(argv: list[str]) -> int:
    top = 12
    if "--top" in argv:
        at = argv.index("--top")
        top = int(argv[at + 1])
        del argv[at : at + 2]
    folder = Path(argv[0] if argv else "out/junit")
    reports = sorted(folder.glob("*.xml"))
    if not reports:
        print(f"no JUnit report in {folder}")
        return 0
    for report in reports:
        seconds = by_file(report)
        total = sum(seconds.values())
        print(f"-- {report.stem}: {total:.0f} s in tests, the longest files:")
        for name, spent in sorted(seconds.items(), key=lambda item: -item[1])[:top]:
            print(f"  {spent:7.0f} s  {100 * spent / total:4.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
