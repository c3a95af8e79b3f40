"""The docs site (and the README): every ```python example of every page runs here, on the test database, so no
example can rot; the configuration page lists every setting with its default and every system
check ID, checked against ``conf.DEFAULTS`` and ``checks.py``.

A page's examples run in order in one namespace (a later example may use an earlier one's
``store``), with ``INSTALLED_APPS``, ``DATABASES`` and ``CACHES`` as plain dicts for the settings
snippets to fill; top-level ``await`` runs in an event loop. An example whose first line is
``# not run: <why>`` (a real model's embedder: tests download none) is compiled, never run, and
listed by :func:`test_only_declared_examples_are_not_run`. An example made of snippet lines
(``--8<-- "tests/test_x.py:section"``) shows a section of a test module of this suite, which pytest
collects and runs like any other (:func:`test_included_examples_are_tests_of_this_suite`).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
NOT_RUN = "# not run:"
SNIPPET = re.compile(r'^--8<-- "(tests/test_[\w]+\.py):\w+"$')


def examples(page: Path) -> list[tuple[int, str]]:
    """The page's python examples: (line, code)."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def run_example(code: str, namespace: dict, where: str) -> None:
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, namespace))
    else:
        exec(compiled, namespace)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)], ids=lambda p: p.name)
def test_every_example_of_the_page_runs(page):
    _clear_the_cache_tier()  # the examples' stores use the configured tier, not a namespace
    namespace = {
        "__name__": f"docs.{page.stem}",
        "INSTALLED_APPS": [],
        "DATABASES": {"default": {}},
        "CACHES": {},
    }
    for line, code in examples(page):
        where = f"{page.relative_to(ROOT)}:{line}"
        if all(SNIPPET.match(row) for row in code.splitlines()):
            continue  # shown from a test module of this suite, which pytest runs itself
        if code.startswith(NOT_RUN):
            compile(code, where, "exec")
            continue
        try:
            run_example(code, namespace, where)
        except Exception as error:
            raise AssertionError(f"the example at {where} raised {error!r}") from error


def _clear_the_cache_tier() -> None:
    """Empty the Redis tier (the suite's own Redis database) when one is configured: the test
    database is flushed between pages, and entries of an earlier page's versions would be newer
    than the next page's (versions restart at 1 in a flushed table)."""
    from django.core.cache import caches

    from agentmemory.conf import get_config

    alias = get_config()["CACHE"]
    if alias:
        caches[alias].clear()


def test_only_declared_examples_are_not_run():
    declared = {
        f"{page.name}:{line}": code.splitlines()[0]
        for page in PAGES
        for line, code in examples(page)
        if code.startswith(NOT_RUN)
    }
    # A real model's embedder (search.md): the suite downloads no model and reaches no network.
    assert sorted(declared) == ["search.md:" + str(_line_of("search.md", "fastembed"))], declared


def _line_of(name: str, needle: str) -> int:
    return next(line for line, code in examples(DOCS / name) if needle in code)


def test_the_configuration_page_shows_every_default():
    from agentmemory.conf import DEFAULTS

    (settings_example,) = [
        code for _, code in examples(DOCS / "configuration.md") if code.startswith("AGENTMEMORY")
    ]
    namespace: dict = {}
    exec(settings_example, namespace)
    assert namespace["AGENTMEMORY"] == DEFAULTS


def test_the_configuration_page_lists_every_check_id():
    source = (ROOT / "agentmemory" / "checks.py").read_text()
    in_code = set(re.findall(r'id="agentmemory\.([EW]\d{3})"', source))
    page = (DOCS / "configuration.md").read_text()
    listed = set(re.findall(r"^\| `agentmemory\.([EW]\d{3})` \|", page, re.M))
    assert in_code and listed == in_code, (sorted(in_code - listed), sorted(listed - in_code))


def test_included_examples_are_tests_of_this_suite():
    included = [
        row
        for page in PAGES
        for _, code in examples(page)
        for row in code.splitlines()
        if row.startswith("--8<--")
    ]
    assert included, "no page includes an example"
    for row in included:
        match = SNIPPET.match(row)
        assert match, f"{row}: only test modules of tests/ may be included as examples"
        module, section = match.group(1), row.rsplit(":", 1)[1].rstrip('"')
        text = (ROOT / match.group(1)).read_text()
        assert f"# --8<-- [start:{section}]" in text, f"{module} has no section {section}"
        assert re.search(rf"\[start:{section}\]\n(@pytest[^\n]*\n)*def test_", text), row


def test_the_front_door_counts_the_self_tests_variants():
    """README and installation say how many kinds of planted bugs --self-test catches: as
    many as there are variants."""
    from agentmemory.defects import Defect

    for page in (ROOT / "README.md", DOCS / "installation.md"):
        counted = re.findall(r"catches (\d+) kinds of planted bugs", page.read_text())
        assert counted == [str(len(Defect))], (page.name, counted)
