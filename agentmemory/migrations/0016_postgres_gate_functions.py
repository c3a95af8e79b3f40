"""PostgreSQL: a session's gate passed in one statement (``agentmemory_pass_gate``), and the
one-statement write with its gate (``agentmemory_upsert_gated``), so that a shard's single
write stays one round trip in autocommit (:mod:`agentmemory.moves`).

``agentmemory_pass_gate`` takes the sessions' shared advisory transaction locks, then -- in a
statement of its own, so in a snapshot taken after the locks (READ COMMITTED) -- looks for a
gate that is not open, and raises SQLSTATE ``AMGT1`` if it finds one. The mover takes the same
locks exclusively. ``agentmemory_upsert_gated`` is ``agentmemory_upsert`` (migration 0008) with
the same two statements first. Nothing on other databases."""

import importlib

from django.db import migrations

GATE_STATE = "AMGT1"

CREATE_PASS = f"""
CREATE FUNCTION agentmemory_pass_gate(p_keys bigint[], p_sessions text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(k) FROM unnest(p_keys) AS k;
    IF EXISTS (
        SELECT 1 FROM agentmemory_sessiongate g
        WHERE g.session_id = ANY(p_sessions) AND g.state <> 'open'
    ) THEN
        RAISE EXCEPTION 'agentmemory: a session of this write is being moved or has moved'
            USING ERRCODE = '{GATE_STATE}';
    END IF;
END
$$
"""

# agentmemory_upsert's own body (migration 0008), the gate's two statements first: inline, as a
# nested call of the two functions cost 80 us more a write (the server's time, profiled).
_REAL = importlib.import_module("agentmemory.migrations.0008_postgres_write_function").CREATE
CREATE_UPSERT = _REAL.replace(
    "CREATE FUNCTION agentmemory_upsert(\n    ",
    "CREATE FUNCTION agentmemory_upsert_gated(\n    p_gate bigint, ",
).replace(
    "BEGIN\n    RETURN QUERY",
    f"""BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_gate);
    IF EXISTS (
        SELECT 1 FROM agentmemory_sessiongate g
        WHERE g.session_id = p_session_id AND g.state <> 'open'
    ) THEN
        RAISE EXCEPTION 'agentmemory: the session of this write is being moved or has moved'
            USING ERRCODE = '{GATE_STATE}';
    END IF;
    RETURN QUERY""",
)
assert "agentmemory_upsert_gated(" in CREATE_UPSERT and "p_gate" in CREATE_UPSERT
assert "pg_advisory_xact_lock_shared(p_gate)" in CREATE_UPSERT

DROP = (
    "DROP FUNCTION IF EXISTS agentmemory_upsert_gated(bigint, text, text, jsonb, timestamptz, "
    "timestamptz, bytea, bigint, text)",
    "DROP FUNCTION IF EXISTS agentmemory_pass_gate(bigint[], text[])",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)
        schema_editor.execute(CREATE_PASS)
        schema_editor.execute(CREATE_UPSERT)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("agentmemory", "0015_session_gate"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
