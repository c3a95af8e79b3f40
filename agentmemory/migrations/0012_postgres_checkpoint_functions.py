"""PostgreSQL: a checkpointer's ``put`` and ``put_writes`` as functions of the database's own,
``agentmemory_put_checkpoint`` and ``agentmemory_put_writes``: one round trip each, in autocommit
(they were BEGIN, the chain head's lock, the probe, the blobs, the insert, COMMIT: six).

The statements are the ones :mod:`agentmemory.checkpoints` sends on the other databases, in the
same order, and keep the same guarantees:

- the chain's head is written first (created if missing), which takes its row lock: two puts to
  one chain run one after the other;
- under READ COMMITTED each statement of a (volatile) function takes a new snapshot, so the probe
  that follows the lock sees what the writer before it committed -- one CTE would not (its one
  snapshot is older than the lock): two writers that loaded the same latest checkpoint cannot
  both extend it;
- a put that conflicts raises (SQLSTATE ``AMCP1``, the latest checkpoint id as the message): the
  statement, the head's write included, is rolled back and nothing is written; a head erased each
  time it was created raises ``AMCP2``. :mod:`agentmemory.checkpoints` turns them into
  :class:`~agentmemory.CheckpointConflict` and :class:`~agentmemory.MemoryUnavailable`.

The blobs and writes come as parallel arrays (``unnest``), so the call's text does not grow with
them: it is planned once per connection. And, for memcheck's self-test only, a broken copy of the
put without its conflict check (:data:`FORKS`). Nothing on other databases."""

from django.db import migrations

#: Rounds of "lock the head, or create it" before giving up (as ``vendors.CREATE_ATTEMPTS``).
HEAD = """
    FOR attempt IN 1..50 LOOP
        UPDATE agentmemory_checkpointthread SET version = version + 1, updated_at = p_at
        WHERE thread_id = p_thread_id AND checkpoint_ns = p_checkpoint_ns
        RETURNING id INTO v_head;
        EXIT WHEN FOUND;
        INSERT INTO agentmemory_checkpointthread (
            thread_id, checkpoint_ns, version, created_at, updated_at
        ) VALUES (p_thread_id, p_checkpoint_ns, 0, p_at, p_at) ON CONFLICT DO NOTHING;
    END LOOP;
    IF v_head IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'AMCP2',
            MESSAGE = 'the checkpoint chain was erased each time this write created it';
    END IF;
"""

PUT = (
    """
CREATE FUNCTION agentmemory_put_checkpoint(
    p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent text, p_expect text,
    p_type text, p_checkpoint bytea, p_metadata_type text, p_metadata bytea, p_run_id text,
    p_versions jsonb, p_at timestamptz,
    p_channels text[], p_blob_versions text[], p_blob_types text[], p_blobs bytea[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_stored boolean;
    v_latest text;
BEGIN"""
    + HEAD
    + """
    SELECT EXISTS (
        SELECT 1 FROM agentmemory_checkpoint c
        WHERE c.thread_id = v_head AND c.checkpoint_id = p_checkpoint_id
    ), (
        SELECT c.checkpoint_id FROM agentmemory_checkpoint c WHERE c.thread_id = v_head
        ORDER BY c.thread_id DESC, c.checkpoint_id DESC LIMIT 1
    ) INTO v_stored, v_latest;
    IF NOT v_stored AND p_expect IS NOT NULL AND p_parent IS NOT NULL
            AND p_parent IS DISTINCT FROM v_latest AND p_parent <> p_expect THEN
        RAISE EXCEPTION USING ERRCODE = 'AMCP1', MESSAGE = coalesce(v_latest, '');
    END IF;
    INSERT INTO agentmemory_checkpointblob (thread_id, channel, version, type, blob)
    SELECT v_head, u.channel, u.version, u.type, u.blob
    FROM unnest(p_channels, p_blob_versions, p_blob_types, p_blobs)
        AS u (channel, version, type, blob)
    ON CONFLICT DO NOTHING;
    IF v_stored THEN  -- the same checkpoint again: a retry, or LangGraph saving it anew
        UPDATE agentmemory_checkpoint SET parent_checkpoint_id = p_parent, type = p_type,
            checkpoint = p_checkpoint, metadata_type = p_metadata_type, metadata = p_metadata,
            run_id = p_run_id, channel_versions = p_versions
        WHERE thread_id = v_head AND checkpoint_id = p_checkpoint_id;
    ELSE
        INSERT INTO agentmemory_checkpoint (
            thread_id, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata_type,
            metadata, run_id, channel_versions, created_at
        ) VALUES (
            v_head, p_checkpoint_id, p_parent, p_type, p_checkpoint, p_metadata_type,
            p_metadata, p_run_id, p_versions, p_at
        );
    END IF;
END
$$
"""
)

PUT_WRITES = (
    """
CREATE FUNCTION agentmemory_put_writes(
    p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_task_id text,
    p_task_path text, p_at timestamptz,
    p_idx bigint[], p_channels text[], p_types text[], p_blobs bytea[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
BEGIN"""
    + HEAD
    + """
    -- A write of an (idx) the task stored already is kept; the special ones (negative indexes:
    -- an error, an interrupt, a resume) replace it, as in LangGraph's savers.
    INSERT INTO agentmemory_checkpointwrite (
        thread_id, checkpoint_id, task_id, idx, task_path, channel, type, blob
    )
    SELECT v_head, p_checkpoint_id, p_task_id, u.idx, p_task_path, u.channel, u.type, u.blob
    FROM unnest(p_idx, p_channels, p_types, p_blobs) AS u (idx, channel, type, blob)
    WHERE u.idx >= 0
    ON CONFLICT DO NOTHING;
    INSERT INTO agentmemory_checkpointwrite (
        thread_id, checkpoint_id, task_id, idx, task_path, channel, type, blob
    )
    SELECT v_head, p_checkpoint_id, p_task_id, u.idx, p_task_path, u.channel, u.type, u.blob
    FROM unnest(p_idx, p_channels, p_types, p_blobs) AS u (idx, channel, type, blob)
    WHERE u.idx < 0
    ON CONFLICT (thread_id, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = excluded.task_path, channel = excluded.channel, type = excluded.type,
        blob = excluded.blob;
END
$$
"""
)

#: memcheck's self-test only (``Defect.PUT_FUNCTION_FORKS``, the declared seam of the function
#: itself, as migration 0010's): a copy of ``agentmemory_put_checkpoint`` without its conflict
#: check -- a put from a parent that is no longer the latest is stored, a silent fork. Its body is
#: the real one with that one statement taken out: the two cannot drift apart.
FORKS = "agentmemory_put_checkpoint_selftest_forks"
CHECK = """    IF NOT v_stored AND p_expect IS NOT NULL AND p_parent IS NOT NULL
            AND p_parent IS DISTINCT FROM v_latest AND p_parent <> p_expect THEN
        RAISE EXCEPTION USING ERRCODE = 'AMCP1', MESSAGE = coalesce(v_latest, '');
    END IF;
"""
assert CHECK in PUT
PUT_FORKS = PUT.replace("agentmemory_put_checkpoint(", f"{FORKS}(").replace(CHECK, "")

PUT_SIGNATURE = (
    "agentmemory_put_checkpoint(text, text, text, text, text, text, bytea, text, bytea, text, "
    "jsonb, timestamptz, text[], text[], text[], bytea[])"
)
PUT_WRITES_SIGNATURE = (
    "agentmemory_put_writes(text, text, text, text, text, timestamptz, bigint[], text[], text[], "
    "bytea[])"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        drop(apps, schema_editor)  # CREATE OR REPLACE cannot rename a parameter
        schema_editor.execute(PUT)
        schema_editor.execute(PUT_WRITES)
        schema_editor.execute(PUT_FORKS)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {PUT_SIGNATURE}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {PUT_WRITES_SIGNATURE}")
        forks = PUT_SIGNATURE.replace("agentmemory_put_checkpoint(", f"{FORKS}(")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {forks}")


class Migration(migrations.Migration):
    dependencies = [
        ("agentmemory", "0011_cache_incarnation"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
