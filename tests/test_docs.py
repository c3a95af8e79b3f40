"""The docs site (and the README): every ```python example of every page runs here, on the test database, so no
example can rot; the configuration page lists every setting with its default and every system
check ID, checked against ``conf.DEFAULTS`` and ``checks.py``.

A page's examples run in order in one namespace (a later example may use an earlier one's
``store``), with ``INSTALLED_APPS``, ``DATABASES`` and ``CACHES`` as plain dicts for the settings
snippets to fill; top-level ``await`` runs in an event loop. An example whose first line is
``# not run: <why>`` (a real model's embedder: tests download none) is compiled, never run, and
listed by :func:`test_only_declared_examples_are_not_run`. An example whose first line is
``# a script of its own`` is a whole script (agentmemory without a Django project): a new
interpreter runs it in an empty folder, without the suite's settings. An example whose first line
is ``# tests/...`` is a test module of the reader's suite: pytest collects it through the plugin
(tests/test_docs_testing_page.py). No page includes an example from elsewhere.
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
#: The first line of an example that is a whole script: run by a new interpreter, in a folder of
#: its own, without the suite's settings -- as a reader who pastes it into a file runs it.
SCRIPT = "# a script of its own"
#: The first line of an example that is a test module of the reader's suite (docs/testing.md):
#: collected and run by pytest through the plugin (tests/test_docs_testing_page.py).
TEST_MODULE = "# tests/"


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
        if code.startswith(TEST_MODULE):
            continue  # a test of the reader's suite: tests/test_docs_testing_page.py runs it
        if code.startswith(NOT_RUN):
            compile(code, where, "exec")
            continue
        if code.startswith(SCRIPT):
            run_script(code, where)
            continue
        try:
            run_example(code, namespace, where)
        except Exception as error:
            raise AssertionError(f"the example at {where} raised {error!r}") from error


def run_script(code: str, where: str) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="docs-script-") as folder:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert done.returncode == 0, f"the script at {where} failed:\n{done.stderr[-3000:]}"


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
    # An MCP client of a server on a port (mcp.md): tests/test_mcp.py drives that path.
    assert sorted(declared) == [
        "mcp.md:" + str(_line_of("mcp.md", "streamable_http_client")),
        "search.md:" + str(_line_of("search.md", "fastembed")),
    ], declared


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


def test_every_example_is_in_its_page():
    """No page includes its examples from elsewhere (a snippet include shows an include line on
    GitHub and in an editor, not code): every example is the page's own, run by this suite."""
    for page in PAGES:
        for line, code in examples(page):
            assert "--8<--" not in code, f"{page.name}:{line} includes an example, not shows it"


def test_the_front_door_counts_the_self_tests_variants():
    """README and installation say how many kinds of planted bugs --self-test catches: as
    many as there are variants."""
    from agentmemory.defects import Defect

    for page in (ROOT / "README.md", DOCS / "installation.md"):
        counted = re.findall(r"catches (\d+) kinds of planted bugs", page.read_text())
        assert counted == [str(len(Defect))], (page.name, counted)


# ---------------------------------------------------------------------- in a new project

#: The first words of a settings example: it goes into the project's settings.py.
SETTINGS = ("INSTALLED_APPS", "DATABASES", "CACHES", "AGENTMEMORY")


def _settings_example() -> str:
    """installation.md's settings example: what a reader adds to a new project."""
    (code,) = [c for _, c in examples(DOCS / "installation.md") if c.startswith("INSTALLED_APPS")]
    return code


@pytest.fixture(scope="session")
def new_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``django-admin startproject`` of the interpreter the suite runs, nothing added."""
    import subprocess
    import sys

    base = tmp_path_factory.mktemp("docs-project")
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "agentsite", str(base)],
        check=True,
        env=_env(),
        capture_output=True,
    )
    return base


def _env() -> dict[str, str]:
    import os

    drop = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "OTHER_DATABASE_URL")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _kept_out(code: str) -> bool:
    """Examples run elsewhere: scripts of their own, the reader's tests, the declared not-run."""
    return code.startswith((SCRIPT, TEST_MODULE, NOT_RUN))


@pytest.mark.sqlite
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(not _kept_out(c) for _, c in examples(p))],
    ids=lambda p: p.name,
)
def test_the_page_runs_as_written_in_a_new_project(page, new_project, tmp_path):
    """A reader's way through the page: a new ``startproject`` (with installation.md's settings
    example, unless the page shows its own), the page's settings examples added to its
    settings.py, ``migrate``, then the page's other examples in order in ``manage.py shell`` --
    exactly as written, not in this suite's process or settings."""
    import shutil
    import subprocess
    import sys

    project = tmp_path / "project"
    shutil.copytree(new_project, project)
    codes = [code for _, code in examples(page) if not _kept_out(code)]
    settings = [code for code in codes if code.startswith(SETTINGS)]
    if not any(code.startswith("INSTALLED_APPS") for code in settings):
        settings.insert(0, _settings_example())
    path = project / "agentsite" / "settings.py"
    path.write_text(path.read_text() + "\n\n" + "\n\n".join(settings) + "\n")
    (project / "page.py").write_text("\n\n".join(c for c in codes if c not in settings))
    for command in (["migrate", "-v0"], ["shell", "-c", "exec(open('page.py').read())"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command],
            cwd=project,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{page.name}, manage.py {command[0]}:\n{done.stderr[-3000:]}"
