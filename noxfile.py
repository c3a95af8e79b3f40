"""The support matrix: ``nox`` (or ``make matrix``).

Sessions:

- ``tests(python, django)``: the SQLite suite, Redis on, for every supported pair -- Django 5.2 LTS
  on Python 3.11, 3.12 and 3.13; Django 6.0 and 6.1 on 3.12 and 3.13 (Django 6 needs 3.12). The
  package is installed as a user would (``django-agentmemory[redis,testing,search,report]`` from
  this checkout, plus the suite's own tools), with nothing overridden: pip resolves Django within
  the declared range.
- ``servers``: the whole suite on every server (``scripts/test.sh``) on the default pair.
- ``lint``: ruff.
- ``package``: sdist and wheel (``python -m build``), ``twine check``, then the wheel installed into
  a new venv outside the repository: ``startproject``, ``migrate``, ``memcheck``, the admin, the
  pytest plugin (``scripts/wheel_smoke.py``).

Interpreters are looked up on PATH and in pyenv (``$PYENV_ROOT/versions/X.Y.*``); the list found is
printed first. A missing one is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import date
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PAIRS = [
    ("3.11", "5.2"),
    ("3.12", "5.2"),
    ("3.12", "6.0"),
    ("3.12", "6.1"),
    ("3.13", "5.2"),
    ("3.13", "6.0"),
    ("3.13", "6.1"),
]
DEFAULT = ("3.11", "5.2")
#: CI runs a third of the other pairs each day, in turn (the day's ordinal modulo 3): two pairs
#: a day, one on Python 3.12 and one on 3.13; three days hold every pair. Six pairs took 6 x 13-18
#: minutes of CI's 90 on two cores, three pairs a day still left CI at the limit; ``make matrix``
#: runs all of them.
CI_THIRDS = (
    [("3.12", "6.0"), ("3.13", "6.1")],
    [("3.12", "6.1"), ("3.13", "6.0")],
    [("3.12", "5.2"), ("3.13", "5.2")],
)
PYTHONS = sorted({python for python, _ in PAIRS})
#: The suite's own tools, beside django-agentmemory[redis,testing,search,report]: settings from a
#: URL, the browser test, the LangGraph adapters' tests (and LangGraph's checkpointer conformance suite), and both server drivers (the SQLite suite still
#: classifies their exceptions: which MariaDB, TiDB and PostgreSQL errors are retried).
SUITE_TOOLS = [
    "dj-database-url>=2.1",
    "selenium>=4.20",
    "langgraph>=1.0",
    "langgraph-checkpoint>=4.3",
    "langgraph-checkpoint-conformance>=0.0.2",
    "openai-agents>=0.24",
    "google-adk>=2.13",
    "agent-framework-core>=1.23",
    "llama-index-core>=0.14",
    "mcp>=2.3,<3",
    "opentelemetry-sdk>=1.20",
    "uvicorn>=0.30",
    "mysqlclient>=2.2",
    "psycopg[binary]>=3.1",
    # A hung test fails after [tool.pytest.ini_options] timeout; the slow ones carry their own.
    "pytest-timeout>=2.3",
]
#: Redis database of the matrix (scripts/test.sh uses 15): the cache tests clear it.
REDIS_DB = 12

nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests", "package"]


def find_interpreters() -> dict[str, str | None]:
    """Each supported Python X.Y: on PATH as pythonX.Y, else the newest pyenv X.Y.*; the pyenv
    folders found are put on PATH so that nox (and uv) find them."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found: dict[str, str | None] = {}
    for version in PYTHONS:
        candidates = sorted(
            root.glob(f"{version}.*/bin/python{version}"),
            key=lambda p: [int(n) for n in p.parent.parent.name.split(".") if n.isdigit()],
        )
        on_path = shutil.which(f"python{version}")
        if on_path and "shims" not in on_path:
            found[version] = on_path
        elif candidates:
            found[version] = str(candidates[-1])
            os.environ["PATH"] = f"{candidates[-1].parent}{os.pathsep}{os.environ['PATH']}"
        else:
            found[version] = None
    return found


TODAY = CI_THIRDS[date.today().toordinal() % 3]
assert {pair for third in CI_THIRDS for pair in third} == set(PAIRS) - {DEFAULT}
INTERPRETERS = find_interpreters()
print(
    f"nox: CI's pairs today: {', '.join(f'{p}/Django {d}' for p, d in TODAY)}",
    file=sys.stderr,
)
print(
    "nox: interpreters: "
    + ", ".join(f"{v} = {path or 'MISSING'}" for v, path in INTERPRETERS.items()),
    file=sys.stderr,
)


def _ci_tags(python: str, django: str) -> list[str]:
    """Today's pairs are tagged "ci" and "ci-N" (N: 1 or 2, their place in today's third)."""
    if (python, django) not in TODAY:
        return []
    return ["ci", f"ci-{TODAY.index((python, django)) + 1}"]


def _suite_env(session: nox.Session, name: str) -> dict[str, str]:
    folder = Path(session.create_tmp())
    return {
        "DATABASE_URL": f"sqlite:///{folder / f'{name}.sqlite3'}",
        "OTHER_DATABASE_URL": f"sqlite:///{folder / f'{name}-other.sqlite3'}",
        "REDIS_URL": os.environ.get("MATRIX_REDIS_URL", f"redis://127.0.0.1:6379/{REDIS_DB}"),
    }


@nox.session
@nox.parametrize(
    ("python", "django"),
    [
        # CI (tag "ci") runs today's third of the pairs (CI_THIRDS), each pair in a lane of its
        # own (tags "ci-1", "ci-2"); `make test` runs the default one on every server.
        nox.param(p, d, id=f"{p}-django{d}", tags=_ci_tags(p, d))
        for p, d in PAIRS
    ],
)
def tests(session: nox.Session, django: str) -> None:
    """The SQLite suite with Redis, on one (Python, Django) pair."""
    session.run("bash", "scripts/services.sh", external=True)
    # Django X.Y as a constraint, not an override: agentmemory's own range must admit it.
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(f"Django~={django}.0\n")
    session.install("-c", str(constraints), ".[redis,testing,search,report]", *SUITE_TOOLS)
    session.run(
        "python", "-c", "import django, sys; print('Django', django.get_version(), sys.version)"
    )
    env = _suite_env(session, f"matrix-{session.python}-{django}")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-q", *session.posargs, env=env)


@nox.session(python=DEFAULT[0])
def servers(session: nox.Session) -> None:
    """The whole suite on SQLite, MariaDB, PostgreSQL and the Galera cluster (scripts/test.sh),
    on the default pair, in this session's interpreter."""
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(f"Django~={DEFAULT[1]}.0\n")
    session.install("-c", str(constraints), "-r", "requirements.txt")
    python = str(Path(session.bin) / "python")
    session.run("bash", "scripts/test.sh", *session.posargs, env={"PY": python}, external=True)


@nox.session(python=DEFAULT[0])
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHONS[-1], tags=["ci", "ci-2"])
def package(session: nox.Session) -> None:
    """Build, check, and install the wheel into a fresh project outside the repository."""
    session.install("build>=1.2", "twine>=5")
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    artifacts = sorted(str(p) for p in dist.iterdir())
    session.run("twine", "check", "--strict", *artifacts)
    wheel = next(p for p in artifacts if p.endswith(".whl"))
    session.run("python", str(ROOT / "scripts" / "wheel_smoke.py"), wheel)
