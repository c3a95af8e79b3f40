"""PostgreSQL: a deliberately broken copy of ``agentmemory_upsert`` (migration 0008), for
``memcheck --self-test`` only -- the declared seam that plants a bug in the function itself
(``Defect.UPSERT_SKIPS_HISTORY``): on an overwrite it inserts no history version. The store never
calls it otherwise; without it, a bug planted in the function was caught by no self-test variant
(the other defects switch the one-statement path off). Nothing on other databases."""

import importlib

from django.db import migrations

# The body is the real function's, with one line changed: the two cannot drift apart.
CREATE_REAL = importlib.import_module(
    "agentmemory.migrations.0008_postgres_write_function"
).CREATE

NAME = "agentmemory_upsert_selftest_skips_history"
SIGNATURE = "(text, text, jsonb, timestamptz, timestamptz, bytea, bigint, text)"


def _create_sql() -> str:
    real = CREATE_REAL
    broken = real.replace("CREATE FUNCTION agentmemory_upsert(", f"CREATE FUNCTION {NAME}(")
    # The planted bug: the history version only for a new memory (version 1).
    broken = broken.replace(
        "        FROM upd\n    )", "        FROM upd WHERE upd.version = 1\n    )"
    )
    assert broken != real and "WHERE upd.version = 1" in broken
    return broken


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {NAME}{SIGNATURE}")
        schema_editor.execute(_create_sql())


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {NAME}{SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("agentmemory", "0009_exact_request_ids"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
