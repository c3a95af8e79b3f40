"""The README's two commands set a fresh machine up, each with what it needs only: `make memcheck`
(the main job) installs no browser; `make test` installs Debian's Chromium and ChromeDriver for the
admin's browser test. Checked through the bootstrap's plan (BOOTSTRAP_PLAN=1: what it would
install, nothing installed), with the browser's paths pointed where nothing is, as on a fresh
machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRESH = {"BOOTSTRAP_CHROMIUM": "/nonexistent/chromium", "BOOTSTRAP_CHROMEDRIVER": "/nonexistent/cd"}


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


def test_make_memcheck_asks_for_no_browser_and_make_test_does():
    memcheck = make_dry_run("memcheck")
    assert "scripts/bootstrap.sh" in memcheck and "--browser" not in memcheck
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
