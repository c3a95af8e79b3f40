"""The README's two commands set a fresh machine up, each with what it needs only: `make memcheck`
(the main job) installs the package and Django -- no browser, no compiler, no system headers, no
framework adapters; `make test` installs everything, and Debian's Chromium and ChromeDriver for the
admin's browser test. Checked through the bootstrap's plan (BOOTSTRAP_PLAN=1: what it would
install, nothing installed), with the browser's and the headers' look-ups pointed where nothing
is, as on a fresh machine; and `make memcheck` run on a fresh copy of the repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRESH = {
    "BOOTSTRAP_CHROMIUM": "/nonexistent/chromium",
    "BOOTSTRAP_CHROMEDRIVER": "/nonexistent/cd",
    "BOOTSTRAP_PKG_CONFIG": "/nonexistent/pkg-config",  # no MariaDB client headers
}
#: What `make memcheck` may install on a fresh machine (#46): packages and megabytes of .venv.
CORE_PACKAGES, CORE_MEGABYTES = 40, 200


def plan(*args: str) -> str:
    done = subprocess.run(
        ["bash", "scripts/bootstrap.sh", *args],
        cwd=ROOT,
        env={**os.environ, **FRESH, "BOOTSTRAP_PLAN": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def make_dry_run(target: str, *variables: str) -> str:
    done = subprocess.run(
        ["make", "-n", target, *variables], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_the_bootstrap_installs_the_browser_only_when_asked():
    assert "chromium" not in plan()
    assert "chromium chromium-driver" in plan("--browser")


def test_the_core_installs_no_system_package_and_the_rest_does():
    everything = plan()
    assert "libmariadb-dev build-essential" in everything
    assert "python requirements: -r requirements.txt" in everything
    core = plan("--core")
    assert "system packages" not in core
    assert core.strip() == "bootstrap plan: python requirements: -r requirements-core.txt"
    assert "-r requirements-core.txt -e .[report]" in plan("--core", "--report")


def test_make_memcheck_asks_for_the_core_only_and_make_test_for_everything():
    memcheck = make_dry_run("memcheck")
    assert "scripts/bootstrap.sh --core" in memcheck and "--browser" not in memcheck
    assert "--core --report" in make_dry_run("memcheck", "REPORT=out/memcheck")
    assert "scripts/test.sh" in make_dry_run("test")
    assert "bootstrap.sh --browser" in (ROOT / "scripts" / "test.sh").read_text()


def test_an_unknown_bootstrap_argument_is_refused():
    with pytest.raises(subprocess.CalledProcessError) as refused:
        plan("--brwoser")
    assert refused.value.returncode == 2 and "--brwoser" in refused.value.stderr


def test_make_memcheck_writes_a_report_when_asked_for_one():
    assert "--report" not in make_dry_run("memcheck")
    assert "manage.py memcheck --report out/memcheck" in make_dry_run(
        "memcheck", "REPORT=out/memcheck"
    )


@pytest.mark.sqlite
@pytest.mark.slow
def test_make_memcheck_on_a_fresh_copy_installs_the_core_only_and_passes(tmp_path):
    """The README's main command from scratch: a copy of the repository without .venv, no
    DATABASE_URL or REDIS_URL: it passes, within the package and size budget of #46."""
    import shutil
    import time

    copy = tmp_path / "agentmemory"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in (path.decode() for path in tracked if path):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "OTHER_DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT / ".venv"))
    )
    started = time.monotonic()
    done = subprocess.run(
        ["make", "memcheck"], cwd=copy, env=env, capture_output=True, text=True, timeout=600
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RESULT: no anomaly" in done.stdout
    listed = subprocess.run(
        [str(copy / ".venv/bin/python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    size = sum(f.stat().st_size for f in (copy / ".venv").rglob("*") if f.is_file()) / 1e6
    print(f"make memcheck on a fresh copy: {took:.0f} s, {len(listed)} packages, {size:.0f} MB")
    assert len(listed) <= CORE_PACKAGES, listed
    assert size <= CORE_MEGABYTES
    assert not any(
        name.lower().startswith(("langgraph", "mysqlclient", "selenium")) for name in listed
    )
