"""``manage.py purge_expired``: what a scheduler runs to expire what is past its TTL -- memories
and logs, in batches, with a dry run, a progress line per batch and a summary; bad input
refused with exit code 2 and nothing changed."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agentmemory import clock
from agentmemory.models import LogOp, Memory, MemoryState, Op

pytestmark = pytest.mark.django_db


def purge(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("purge_expired", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_dry_run_counts_and_the_run_expires_in_batches(store):
    for key in ("a", "b", "c", "d", "e"):
        store.remember("s", key, key, ttl=60)
    store.remember("s", "kept", "kept")  # no TTL
    store.remember("s", "later", "later", ttl=3600)
    store.append("s", "chat", ["hello"], ttl=60)
    store.append("s", "notes", ["kept"])
    assert store.recall("s", "a").value == "a"  # warm in the Redis tier, where there is one
    clock.advance(timedelta(seconds=61))

    out, err = purge("--dry-run")
    assert "would expire 5 memories and 1 logs (dry run: nothing changed)" in out
    assert Memory.objects.filter(state=MemoryState.LIVE).count() == 7

    out, err = purge("--batch", "2")
    assert "expired 6 memories and logs" in out
    # A progress line per batch of memories (2, 4, 5), then the logs'.
    assert [line.split()[-4] for line in err.splitlines()] == ["2/6", "4/6", "5/6", "6/6"]
    assert store.recall("s", "a") is None
    assert [h.op for h in store.history("s", "a")] == [Op.WRITE, Op.EXPIRE]
    assert {k: r.value for k, r in store.recall_many("s").items()} == {
        "kept": "kept",
        "later": "later",
    }
    assert [e.op for e in store.log_history("s", "chat")] == [LogOp.APPEND, LogOp.EXPIRE]
    assert [i.value for i in store.read_log("s", "notes")] == ["kept"]

    out, _err = purge()  # again: nothing left to expire
    assert "expired 0 memories and logs" in out
    assert "would expire 0 memories and 0 logs" in purge("--dry-run")[0]


def test_a_memory_written_again_with_a_new_ttl_is_not_expired(store):
    store.remember("s", "k", 1, ttl=60)
    clock.advance(timedelta(seconds=61))
    store.remember("s", "k", 2, ttl=60)  # written again before the scheduler ran
    assert "would expire 0 memories" in purge("--dry-run")[0]
    assert "expired 0 memories and logs" in purge()[0]
    assert store.recall("s", "k").value == 2


@pytest.mark.parametrize(
    "args, named",
    [
        (["--batch", "0"], "batch"),
        (["--batch", "100001"], "batch"),
        (["--dry-run", "--batch", "-1"], "batch"),
        (["--database", "nope"], "unknown database alias 'nope'"),
    ],
)
def test_bad_options_exit_2_naming_what_was_wrong_and_change_nothing(store, args, named):
    store.remember("s", "k", 1, ttl=1)
    clock.advance(timedelta(seconds=2))
    with pytest.raises(CommandError, match=named) as refused:
        purge(*args)
    assert refused.value.returncode == 2
    assert Memory.objects.get(key="k").state == MemoryState.LIVE


def test_a_batch_that_is_not_a_number_is_refused_by_the_parser():
    with pytest.raises(CommandError, match="--batch: invalid int value: 'ten'"):
        purge("--batch", "ten")
