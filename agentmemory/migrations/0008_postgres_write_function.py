"""PostgreSQL: the one-statement write of a new value (the store's commonest call) as a function
of the database's own, ``agentmemory_upsert``.

Django binds parameters on the client by default: every call sends the whole statement, and the
server parses, analyses and plans it again (a two-CTE upsert: most of what a ``remember`` costs
the server). A PL/pgSQL function's statements are planned once per connection and kept, and its
call is a short statement -- what prepared statements would give, without them (a pooler in
transaction mode cannot keep a prepared statement; it can call a function). The body is the
statement ``agentmemory.sql`` sent before: insert version 1, or on conflict take the row lock and
count the version (unless a passed TTL must first become a version of its own: nothing is
returned then, and the store takes its locked path), and insert the history version in the same
statement. Nothing on other databases."""

from django.db import migrations

CREATE = """
CREATE FUNCTION agentmemory_upsert(
    p_session_id text, p_key text, p_value jsonb, p_at timestamptz, p_expires_at timestamptz,
    p_embedding bytea, p_embedding_key bigint, p_request_id text
) RETURNS TABLE (id bigint, version bigint, created_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH upd AS (
        INSERT INTO agentmemory_memory AS m (
            session_id, "key", value, version, state, created_at, updated_at, expires_at,
            history_from, embedding, embedding_key
        ) VALUES (
            p_session_id, p_key, p_value, 1, 'live', p_at, p_at, p_expires_at, 1, p_embedding,
            p_embedding_key
        )
        ON CONFLICT (session_id, "key") DO UPDATE SET
            version = m.version + 1,
            value = EXCLUDED.value,
            state = 'live',
            created_at = CASE WHEN m.state = 'live' THEN m.created_at ELSE EXCLUDED.created_at END,
            updated_at = EXCLUDED.updated_at,
            expires_at = EXCLUDED.expires_at,
            embedding = EXCLUDED.embedding,
            embedding_key = EXCLUDED.embedding_key
        WHERE NOT (m.state = 'live' AND m.expires_at IS NOT NULL AND m.expires_at <= p_at)
        RETURNING m.id, m.version, m.created_at
    ), ins AS (
        INSERT INTO agentmemory_memoryversion (
            memory_id, version, op, value, created_at, expires_at, request_id, embedding
        )
        SELECT upd.id, upd.version, 'write', p_value, p_at, p_expires_at, p_request_id,
            p_embedding
        FROM upd
    )
    SELECT upd.id, upd.version, upd.created_at FROM upd;
END
$$
"""

DROP = "DROP FUNCTION IF EXISTS agentmemory_upsert(text, text, jsonb, timestamptz, timestamptz, bytea, bigint, text)"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)  # CREATE OR REPLACE cannot rename a parameter
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("agentmemory", "0007_checkpoints"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
