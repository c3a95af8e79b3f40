"""PostgreSQL: a session's gate passed in one statement (``agentmemory_pass_gate``), and the
one-statement write with its gate (``agentmemory_upsert_gated``), so that a shard's single
write stays one round trip in autocommit (:mod:`agentmemory.moves`).

``agentmemory_pass_gate`` takes the sessions' shared advisory transaction locks, then -- in a
statement of its own, so in a snapshot taken after the locks (READ COMMITTED) -- looks for a
gate that is not open, and raises SQLSTATE ``AMGT1`` if it finds one. The mover takes the same
locks exclusively. ``agentmemory_upsert_gated`` passes the gate, then runs ``agentmemory_upsert``
(migration 0008). Nothing on other databases."""

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

CREATE_UPSERT = """
CREATE FUNCTION agentmemory_upsert_gated(
    p_gate bigint, p_session_id text, p_key text, p_value jsonb, p_at timestamptz,
    p_expires_at timestamptz, p_embedding bytea, p_embedding_key bigint, p_request_id text
) RETURNS TABLE (id bigint, version bigint, created_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentmemory_pass_gate(ARRAY[p_gate], ARRAY[p_session_id]);
    RETURN QUERY SELECT * FROM agentmemory_upsert(
        p_session_id, p_key, p_value, p_at, p_expires_at, p_embedding, p_embedding_key,
        p_request_id
    );
END
$$
"""

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
