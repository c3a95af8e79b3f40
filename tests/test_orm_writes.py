"""The models' own write paths keep the Redis tier behind the database (#43, item 1): a memory
deleted or changed through Django's ORM -- ``QuerySet.delete()``, ``update()``,
``bulk_update()``, ``bulk_create()``, ``Model.save()``/``delete()`` -- is never served from the
tier afterwards, from this process or another (a new store: nothing of this one's memory). It was:
``Memory.objects.filter(session_id=...).delete()`` left ``recall`` returning the deleted memory,
and nothing could repair it."""

from __future__ import annotations

import pytest
from django.db import transaction

from agentmemory import MemoryStore
from agentmemory.models import Memory

from .conftest import redis_alias

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tier() -> MemoryStore:
    """A store with the Redis tier, its entries warm for keys k1, k2 of session s."""
    store = MemoryStore(cache=redis_alias())
    store.remember("s", "k1", "one")
    store.remember("s", "k2", "two")
    store.remember("t", "k1", "other session")
    assert set(store.recall_many("s", ["k1", "k2"])) == {"k1", "k2"}  # served by the tier now
    assert store.cache.stats["hits"] or store.recall("s", "k1").value == "one"
    return store


def fresh() -> MemoryStore:
    """Another client of the same database and tier."""
    return MemoryStore(cache="agentmemory")


def test_a_queryset_delete_is_never_served_from_the_tier(tier):
    deleted, by_model = Memory.objects.filter(session_id="s").delete()
    assert by_model["agentmemory.Memory"] == 2 and deleted >= 2
    for store in (tier, fresh()):
        assert store.recall("s", "k1") is None and store.recall_many("s") == {}
        assert store.recall("t", "k1").value == "other session"  # untouched


def test_a_queryset_update_of_a_served_field_is_never_served_stale(tier):
    assert Memory.objects.filter(session_id="s", key="k1").update(value="edited") == 1
    for store in (tier, fresh()):
        assert store.recall("s", "k1").value == "edited"
    Memory.objects.filter(session_id="s", key="k2").update(key="renamed")
    for store in (tier, fresh()):
        assert store.recall("s", "k2") is None and store.recall("s", "renamed").value == "two"


def test_bulk_update_bulk_create_save_and_delete_of_a_model(tier):
    row = Memory.objects.get(session_id="s", key="k1")
    row.value = "saved"
    row.save()
    assert tier.recall("s", "k1").value == "saved"
    rows = list(Memory.objects.filter(session_id="s"))
    for each in rows:
        each.value = f"bulk {each.key}"
    Memory.objects.bulk_update(rows, ["value"])
    assert (
        tier.recall("s", "k2").value == "bulk k2" and fresh().recall("s", "k1").value == "bulk k1"
    )
    Memory.objects.get(session_id="s", key="k2").delete()
    assert tier.recall("s", "k2") is None
    assert tier.recall("s", "new") is None  # the tier now knows "new" is absent
    template = Memory.objects.get(session_id="s", key="k1")
    template.pk, template.key = None, "new"
    Memory.objects.bulk_create([template])
    assert tier.recall("s", "new").value == "bulk k1"


def test_a_rolled_back_orm_write_leaves_the_tier_as_it_was(tier):
    with pytest.raises(RuntimeError), transaction.atomic():
        Memory.objects.filter(session_id="s").delete()
        raise RuntimeError("rolled back")
    assert tier.recall("s", "k1").value == "one"
    assert tier.cache.stats["hits"] > 0


def test_writes_of_what_the_tier_does_not_serve_go_straight_to_the_database(tier):
    """The store's own updates of vectors and the history watermark: no lock, no invalidation
    (every first write of a key would otherwise pay a Redis round trip)."""
    before = tier.cache.stats["hits"]
    Memory.objects.filter(session_id="s").update(history_from=1)
    assert tier.recall("s", "k1").value == "one" and tier.cache.stats["hits"] > before


def test_django_refusals_are_kept():
    with pytest.raises(TypeError, match="limit"):
        Memory.objects.all()[:1].delete()
    with pytest.raises(TypeError, match="slice"):
        Memory.objects.all()[:1].update(value=1)


def test_manage_py_flush_leaves_the_tier_nothing_to_serve(tier):
    """flush empties every table behind the store; Django then sends post_migrate, and the tier
    forgets everything of that database (a test database's teardown is such a flush too)."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    for store in (tier, fresh()):
        assert store.recall("s", "k1") is None and store.recall_many("t") == {}
    store = fresh()
    store.remember("s", "k1", "after")
    assert store.recall("s", "k1").value == "after"


def test_forgetcache_makes_the_tier_forget_a_database_changed_behind_the_store(tier):
    """Raw SQL (as a restore or a promoted replica would) changes a row in place: the tier
    serves the old value until `manage.py forgetcache`, then the database's."""
    from io import StringIO

    from django.core.management import call_command
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agentmemory_memory SET value = %s WHERE session_id = %s AND "
            + connection.ops.quote_name("key")
            + " = %s",
            ['"raw"', "s", "k1"],
        )
    assert tier.recall("s", "k1").value == "one"  # the tier cannot know (docs/redis.md)
    out = StringIO()
    call_command("forgetcache", stdout=out)
    assert "forgot database 'default'" in out.getvalue()
    for store in (tier, fresh()):
        assert store.recall("s", "k1").value == "raw"


def test_forgetcache_without_a_tier_or_with_an_unknown_alias_exits_2(settings):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="unknown database alias") as info:
        call_command("forgetcache", "--database", "nope")
    assert info.value.returncode == 2
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    with pytest.raises(CommandError, match="no cache tier") as info:
        call_command("forgetcache")
    assert info.value.returncode == 2


# ---------------------------------------------------------------------- memcheck --faults orm
@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_memcheck_orm_faults_find_nothing_wrong(tier):
    """ORM deletes and updates of memories the tier holds, while the workload runs: every read
    after one committed misses what it removed (check orm-bulk), and nothing else is found."""
    from .test_memcheck import run_json

    code, report = run_json("--faults", "orm", "--seconds", "3", "--workers", "4")
    assert report["faults"]["injected"].get("orm-bulk", 0) >= 1, report["faults"]
    assert code == 0, [(a["check"], a["message"]) for a in report["anomalies"][:5]]


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_the_self_test_catches_an_orm_write_that_leaves_the_tier_ahead(tier):
    """The variant orm-write-unseen (the ORM's invalidation skipped, through its declared seam)
    runs under the orm faults whatever the run's faults are, and check orm-bulk catches it."""
    from agentmemory.consistency.selftest import run_self_test
    from agentmemory.consistency.workloads import WorkloadConfig
    from agentmemory.defects import Defect

    result = run_self_test(
        ["default"],
        WorkloadConfig(workers=4, keys=4, ops=400, seconds=None, seed=7),
        faults="lock",
        defects=[Defect.ORM_UNSEEN],
    )
    variant = next(o for o in result.outcomes if o.name == Defect.ORM_UNSEEN.value)
    assert variant.applicable and variant.caught.get("orm-bulk", 0) >= 1, variant
