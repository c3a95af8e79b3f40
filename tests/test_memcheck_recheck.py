"""memcheck --check FILE: a history saved by --history is checked again offline, with the final
state the run compared it with -- the same anomalies as the run that recorded it; a file that is
not one is refused (exit 2) naming the line."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db(transaction=True)


def memcheck(*args: str) -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("memcheck", *args, "--format", "json", stdout=out, stderr=StringIO())
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, json.loads(out.getvalue())


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
@pytest.mark.parametrize("unsafe", [False, True], ids=["clean", "unsafe"])
def test_checking_a_saved_history_again_gives_the_runs_result(tmp_path, unsafe):
    path = tmp_path / "history.jsonl"
    args = ["--ops", "600", "--faults", "none", "--history", str(path)]
    code, report = memcheck(*args, *(["--unsafe"] if unsafe else []))
    assert code == (1 if unsafe else 0), report["anomalies"][:3]
    again_code, again = memcheck("--check", str(path))
    assert again_code == code
    assert again["anomalies"] == json.loads(json.dumps(report["anomalies"], default=str))
    assert again["operations"] == report["operations"]


def test_a_file_that_is_not_a_saved_history_is_refused(tmp_path):
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"id": "t0-1"}\nnot json\n')
    with pytest.raises(CommandError, match="line 1: not a memcheck record") as info:
        call_command("memcheck", "--check", str(garbage))
    assert info.value.returncode == 2
    old = tmp_path / "old.jsonl"  # operations only: saved before the final state was recorded
    old.write_text("")
    with pytest.raises(CommandError, match="no final state"):
        call_command("memcheck", "--check", str(old))
    with pytest.raises(CommandError, match="cannot read --check"):
        call_command("memcheck", "--check", str(tmp_path / "missing.jsonl"))
