"""The tests docs/testing.md shows (its blocks whose first line is ``# tests/...``), run by this
suite through the same plugin a downstream project gets: each block as written, its own imports
included, executed into this module for pytest to collect -- the page's own code, not a copy."""

from __future__ import annotations

from .test_docs import DOCS, TEST_MODULE, examples

PAGE = DOCS / "testing.md"

SHOWN = [code for _line, code in examples(PAGE) if code.startswith(TEST_MODULE)]
for _code in SHOWN:
    exec(compile(_code, str(PAGE), "exec"), globals())


def test_the_page_shows_tests_and_each_is_collected_here():
    shown = {name for code in SHOWN for name in _defined_tests(code)}
    assert len(shown) == 5 and all(name in globals() for name in shown), shown


def _defined_tests(code: str) -> list[str]:
    return [line.split("(")[0][4:] for line in code.splitlines() if line.startswith("def test_")]
