"""memcheck's files, as a hostile or careless user hands them over (#42): ``--check FILE`` on
anything answers exit 2 with one line naming the file, the line and the reason -- never a
traceback, never "anomalies found" for input it could not read, in bounded memory and depth;
``--report DIR`` is checked before the run, refuses a folder that is not empty unless
``--force``, and never writes through a symbolic link inside it; ``--check`` writes the
``--report`` and ``--junit`` it is given; abbreviated options are refused."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db(transaction=True)


def check(path: Path | str, *args: str) -> int:
    """memcheck --check's exit code; a CommandError must be a one-line exit 2."""
    try:
        call_command("memcheck", "--check", str(path), *args, stdout=StringIO(), stderr=StringIO())
    except SystemExit as exit_:
        return int(exit_.code)
    except CommandError as error:
        assert error.returncode == 2 and "\n" not in str(error) and str(path) in str(error)
        return 2
    return 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory, django_db_blocker) -> Path:
    """A history a clean run saved."""
    path = tmp_path_factory.mktemp("saved") / "history.jsonl"
    with django_db_blocker.unblock():
        call_command(
            "memcheck",
            *("--ops", "200", "--faults", "none", "--history", str(path)),
            stdout=StringIO(),
            stderr=StringIO(),
        )
    return path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe not utf-8\n", "line 1: not a memcheck record"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1: JSON nested too deep"),
        (b"[1, 2]\n", "line 1: not a memcheck record (a JSON list"),
        (b'"text"\n', "not a memcheck record"),
        (b'{"record": "final"}\n', "not a memcheck record"),
        (b"\n", "line 1: not a memcheck record"),
    ],
)
def test_a_file_that_is_not_a_history_exits_2_naming_the_line(tmp_path, content, reason):
    path = tmp_path / "h.jsonl"
    path.write_bytes(content)
    with pytest.raises(CommandError, match=reason.replace("(", r"\(")) as info:
        call_command("memcheck", "--check", str(path))
    assert info.value.returncode == 2


def test_what_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    for path in (tmp_path, "/dev/zero"):
        with pytest.raises(CommandError, match="not a regular file") as info:
            call_command("memcheck", "--check", str(path))
        assert info.value.returncode == 2


def test_records_of_the_right_shape_holding_nonsense_exit_2(tmp_path, saved):
    lines = saved.read_text().splitlines()
    op = json.loads(lines[0])
    for field, nonsense in [("invoked_at", "yesterday"), ("version", [1]), ("kind", 7)]:
        path = tmp_path / f"{field}.jsonl"
        path.write_text("\n".join([json.dumps({**op, field: nonsense}), *lines[1:]]) + "\n")
        assert check(path) in (0, 1, 2)  # anything but a traceback


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    edit=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from([b"", b"{", b"]", b"0", b'"', b"\n"])),
        min_size=1,
        max_size=6,
    )
)
def test_any_corruption_of_a_saved_history_is_a_result_or_exit_2(tmp_path, saved, edit):
    data = bytearray(saved.read_bytes())
    for at, replacement in edit:
        at %= len(data)
        data[at : at + 1] = replacement
    path = tmp_path / "corrupt.jsonl"
    path.write_bytes(bytes(data))
    assert check(path) in (0, 1, 2)


def test_check_writes_the_report_and_junit_it_is_given(tmp_path, saved):
    report, junit = tmp_path / "report", tmp_path / "result.xml"
    assert check(saved, "--report", str(report), "--junit", str(junit)) == 0
    assert (report / "index.html").is_file() and (report / "history.jsonl").is_file()
    assert junit.read_text().startswith("<?xml") and "<testcase" in junit.read_text()


def test_a_report_folder_that_is_not_empty_is_refused_before_anything_runs(tmp_path, saved):
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(CommandError, match=r"not empty.*--force") as info:
        call_command("memcheck", "--ops", "50", "--report", str(folder))
    assert info.value.returncode == 2
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_a_symlink_in_the_report_folder_is_replaced_never_followed(tmp_path, saved):
    folder, outside = tmp_path / "report", tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_text("not memcheck's")
    os.symlink(outside, folder / "history.jsonl")
    assert check(saved, "--report", str(folder), "--force") == 0
    assert outside.read_text() == "not memcheck's"
    assert not (folder / "history.jsonl").is_symlink()
    assert (folder / "history.jsonl").read_text() == saved.read_text()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".memcheck-")] == []


def test_a_report_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(CommandError, match="not a folder") as info:
        call_command("memcheck", "--ops", "50", "--report", str(taken))
    assert info.value.returncode == 2
    with pytest.raises(CommandError, match="cannot write --report") as info:
        call_command("memcheck", "--ops", "50", "--report", str(taken / "sub"))
    assert info.value.returncode == 2


@pytest.mark.parametrize("abbreviation", ["--forc", "--rep", "--self"])
def test_abbreviated_options_are_refused(abbreviation):
    with pytest.raises(CommandError, match="unrecognized arguments"):
        call_command("memcheck", abbreviation)


def test_force_without_report_is_refused():
    with pytest.raises(CommandError, match="--force applies to --report") as info:
        call_command("memcheck", "--force")
    assert info.value.returncode == 2
