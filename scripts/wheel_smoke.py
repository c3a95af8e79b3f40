"""The wheel, installed as a new user would: into a fresh venv in a temporary folder outside the
repository, with nothing of the repository on the path.

    python scripts/wheel_smoke.py dist/django_agentmemory-X.Y.Z-py3-none-any.whl

Then a plain script's ``agentmemory.setup(url)`` (no project), ``django-admin startproject``,
``agentmemory`` added to INSTALLED_APPS with the SQLite options the README gives, ``check``, ``migrate``, ``memcheck``, ``memcheck --self-test``, the
admin's pages (the templates must be in the wheel), and a test of the user's own through the
pytest plugin (its entry point must be registered). Exits non-zero at the first step that fails,
naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS_TAIL = """
ALLOWED_HOSTS = ["localhost", "testserver"]
INSTALLED_APPS += ["agentmemory"]
DATABASES["default"]["OPTIONS"] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
}
"""

ADMIN_CHECK = """
from django.contrib.auth.models import User
from django.test import Client
from agentmemory import MemoryStore

MemoryStore().remember("smoke", "greeting", {"text": "hello"})
User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
client.force_login(User.objects.get(username="admin"))
listing = client.get("/admin/agentmemory/memory/")
assert listing.status_code == 200 and b"greeting" in listing.content, listing.status_code
from agentmemory.models import Memory
page = client.get(f"/admin/agentmemory/memory/{Memory.objects.get().pk}/change/")
assert page.status_code == 200 and b"hello" in page.content, page.status_code
print("admin: the memory list and a memory's page render")
"""

USER_TEST = """
def test_my_agent_memory(
    memory_store, concurrently, memory_clock, assert_memory_consistent, transactional_db
):
    concurrently(lambda i: memory_store.update("s", "n", lambda n: n + 1, default=0), workers=4)
    assert memory_store.recall("s", "n").value == 4
    memory_store.remember("s", "short", 1, ttl=60)
    memory_clock.advance(61)
    assert memory_store.recall("s", "short") is None
    assert_memory_consistent(session_id="s")
"""


def step(name: str, *command: str, cwd: Path, env: dict[str, str]) -> str:
    started = time.monotonic()
    shown = " ".join(command)
    print(f"smoke: {name}: {shown if len(shown) < 160 else shown[:157] + '...'}", flush=True)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"smoke: {name} FAILED (exit {done.returncode})")
    print(f"smoke: {name}: ok ({time.monotonic() - started:.1f}s)", flush=True)
    return done.stdout


def main(wheel: str) -> None:
    wheel_path = Path(wheel).resolve()
    repository = Path(__file__).resolve().parent.parent
    # nox points TMPDIR into the repository (.nox/…/tmp): go outside it.
    base = Path(tempfile.gettempdir()).resolve()
    if base == repository or repository in base.parents:
        base = Path("/tmp")
    with tempfile.TemporaryDirectory(prefix="agentmemory-smoke-", dir=base) as tmp:
        folder = Path(tmp)
        assert repository not in folder.parents, "the smoke test must run outside the repository"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "VIRTUAL_ENV")
        }
        venv = folder / "venv"
        step("venv", sys.executable, "-m", "venv", str(venv), cwd=folder, env=env)
        python = str(venv / "bin" / "python")
        step(
            "install",
            python,
            "-m",
            "pip",
            "install",
            "-q",
            f"django-agentmemory[testing] @ {wheel_path.as_uri()}",
            cwd=folder,
            env=env,
        )
        where = step(
            "import",
            python,
            "-c",
            "import agentmemory, pathlib; root = pathlib.Path(agentmemory.__file__).parent; "
            "import django; print(root, agentmemory.__version__, 'Django', django.get_version()); "
            "assert (root / 'py.typed').exists(); "
            "assert list((root / 'migrations').glob('0001_*.py')); "
            "assert list((root / 'templates').rglob('*.html'))",
            cwd=folder,
            env=env,
        )
        if str(repository) in where:
            raise SystemExit(f"smoke: agentmemory was imported from the repository: {where}")
        print(f"smoke: installed at {where.strip()}")
        step(
            "setup without a project",
            python,
            "-c",
            "import agentmemory; store = agentmemory.setup('sqlite:///standalone.db'); "
            "store.remember('ada', 'k', 1); assert store.recall('ada', 'k').version == 1",
            cwd=folder,
            env=env,
        )
        (folder / "agentsite").mkdir()  # Django 5.2 wants the destination to exist (6.x makes it)
        step(
            "startproject",
            str(venv / "bin" / "django-admin"),
            "startproject",
            "agentsite",
            str(folder / "agentsite"),
            cwd=folder,
            env=env,
        )
        project = folder / "agentsite"
        settings = project / "agentsite" / "settings.py"
        settings.write_text(settings.read_text() + SETTINGS_TAIL)
        manage = [python, "manage.py"]
        step("check", *manage, "check", "--fail-level", "WARNING", cwd=project, env=env)
        step("migrate", *manage, "migrate", "-v0", cwd=project, env=env)
        report = step("memcheck", *manage, "memcheck", "--ops", "500", cwd=project, env=env)
        print("smoke: " + report.strip().splitlines()[-1])
        report = step(
            "memcheck --self-test",
            *manage,
            "memcheck",
            "--self-test",
            # As the suite's self-test: at 300 calls a variant whose bug one call in a few hundred
            # shows (ttl=0 among the bad inputs) went unseen in all three of its runs.
            "--ops",
            "600",
            cwd=project,
            env=env,
        )
        print("smoke: " + report.strip().splitlines()[-1])
        print(step("admin", *manage, "shell", "-c", ADMIN_CHECK, cwd=project, env=env).strip())
        (project / "test_memory.py").write_text(USER_TEST)
        step(
            "pytest plugin",
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds=agentsite.settings",
            "test_memory.py",
            cwd=project,
            env=env,
        )
    print("smoke: the wheel installs into a fresh project and works")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
