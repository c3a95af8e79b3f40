"""The search engine of one store: how values are indexed when written, and how a search lists,
ranks, reads and scores them again. :mod:`~agentmemory.semantic` keeps what it runs on -- the
index (texts, embedder, fingerprints), the vectors' format and cache, the filters.

A write embeds its value before the row lock when the value is known up front
(:meth:`SearchEngine.indexing`), or under it (:meth:`SearchEngine.embedder`: ``update``,
``revert``). A search embeds the query first, then makes two reads (:meth:`SearchEngine.search`),
so that every score it returns is computed from the vectors of the very version it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import Q

from .defects import NONE as NO_DEFECTS
from .defects import Defect, Defects, failpoint_between_search_reads
from .errors import EmbeddingFailed, VersionConflict
from .models import Memory, MemoryState, Op
from .reads import ReadPath
from .records import ScoredMemory
from .semantic import (
    MISSING,
    MODELS_SESSION,
    SAME_MODEL_COSINE,
    Index,
    fields_of,
    matches,
    model_of,
    unpack,
    vector_cache,
)
from .sql import RECORD_COLUMNS, record_from_row, run_query
from .vendors import has_prefix, prefix_filter
from .writes import Change, WritePath

#: Fields to index: None (the index's own), False (not indexed) or a list of JSON paths.
IndexFields = bool | list[str] | tuple[str, ...] | None
#: Candidates read whole by id at a time; past this many missing vectors, one scan reads them.
SCAN_PAST = 500
#: A search's second read: (id, embedding_key, session_id, embedding, *RECORD_COLUMNS).
_RESULT_COLUMNS = ("id", "embedding_key", "session_id", "embedding", *RECORD_COLUMNS)


class SearchEngine:
    """Indexing and search for one store's database alias, with its semantic index."""

    def __init__(
        self,
        using: str,
        index: Index,
        reads: ReadPath,
        writes: WritePath,
        *,
        defects: Defects = NO_DEFECTS,
    ) -> None:
        self.using = using
        self.index = index
        self.reads = reads
        self.writes = writes
        #: Planted bugs (:mod:`agentmemory.defects`), for memcheck's self-test only.
        self.defects = defects

    # ------------------------------------------------------------------ writes

    def indexing(self, fields: IndexFields, values: list[Any]) -> list[dict[str, Any]]:
        """The ``Change`` arguments that index each value known up front (one embedder call
        for all of them); ``fields`` False: none."""
        if fields is False or not values:
            return [{} for _ in values]
        vectors = self.index.vectors(values, fields)
        self.check_model()
        # The stale-vector defect needs the value under the lock: it embeds there again.
        embed = self.embedder(fields) if Defect.STALE_VECTOR in self.defects else None
        return [{"vector": vector, "embed": embed} for vector in vectors]

    def embedder(self, fields: IndexFields) -> Callable[[Any], bytes | None] | None:
        """For a value computed under the row lock: the function that embeds it there."""
        if fields is False:
            return None
        self.check_model()  # before the write path: it writes, and fn runs under a row lock
        index = self.index
        return lambda value: index.vectors([value], fields)[0]

    def check_model(self) -> None:
        """Once per index and database (the settings' index is one per process: a store made
        per request checks it once): the embedder gives the probe text the vector its model
        gave it when the store first met that model (kept in :data:`MODELS_SESSION`, one key
        per fingerprint) -- or :class:`EmbeddingFailed`, before anything is written: an
        embedder that changed under the same name would make vectors no search may compare
        with the stored ones."""
        index = self.index
        if self.using in index.checked:
            return
        import numpy as np

        key = f"model-{index.tag:08x}"
        probe = index.probe
        record = self.reads.recall(MODELS_SESSION, [key]).get(key)
        if record is None:
            value = {
                "model": index.model_name,
                "dims": index.dims,
                "probe": [round(float(x), 6) for x in probe],
            }
            first = Change(Op.WRITE, compute=lambda _: value, expected_version=0, blind=True)
            try:
                record = self.writes.write(MODELS_SESSION, {key: first})[key]
            except VersionConflict:
                record = self.reads.recall(MODELS_SESSION, [key]).get(key)
        known = np.asarray((record.value or {}).get("probe", []) if record else [], np.float32)
        similarity = float(known @ probe) if known.shape == probe.shape else -1.0
        if similarity < SAME_MODEL_COSINE:
            raise EmbeddingFailed(
                f"the embedder gives other vectors than the model {index.model_name!r} "
                f"({index.dims} dims) gave when its memories were indexed (probe similarity "
                f"{similarity:.3f}): name the new model in AGENTMEMORY['SEARCH']['MODEL'] (or "
                "Index(model=...)) and run `manage.py reindex`; nothing was written"
            )
        index.checked.add(self.using)

    def reindex(
        self,
        batch: int,
        dry_run: bool,
        progress: Callable[[int, int], None] | None,
        session_id: str | None,
    ) -> int:
        """See ``MemoryStore.reindex``: the live, indexed memories whose vectors another model
        made, embedded again from the paths each was indexed by, in place."""
        index = self.index
        if not dry_run:
            self.check_model()
        columns = ("version", "value", "embedding")
        batches = self.reads.batches(columns, batch, progress, session_id=session_id, indexed=True)
        changed = 0
        for found in batches:
            stale = [row for row in found if model_of(row[3]) != index.tag]
            if dry_run:
                changed += len(stale)
                continue
            by_fields: dict[Any, list[tuple[Any, ...]]] = {}
            for row in stale:
                fields = fields_of(row[3])
                by_fields.setdefault(None if fields is None else tuple(fields), []).append(row)
            for fields, group in by_fields.items():
                vectors = index.vectors([row[2] for row in group], fields)
                for (memory_id, version, _, _), vector in zip(group, vectors, strict=True):
                    changed += self.writes.reindex(memory_id, version, vector)
        return changed

    # ------------------------------------------------------------------ search

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        session_prefix: str | None = None,
        prefix: str | None = None,
        conditions: dict[str, Any],
        limit: int,
        offset: int,
    ) -> list[ScoredMemory]:
        """The ranked page of one session's memories (``session_id``) or of every session whose
        id starts with ``session_prefix``; the arguments are validated by the store."""
        self.check_model()
        if session_id is not None:
            sessions = Q(session_id=session_id)
        else:
            assert session_prefix is not None
            sessions = prefix_filter(connections[self.using], "session_id", session_prefix)
        # The query is embedded before the database is read: every write acknowledged before
        # this call is in what the read sees.
        wanted = self.index.query_vector(query)
        scope = _Scope(sessions, session_prefix, prefix, session_id)
        return self.reads.from_database(
            lambda: self._ranked(wanted, scope, conditions, limit, offset)
        )

    def _ranked(
        self, wanted: Any, scope: _Scope, conditions: dict[str, Any], limit: int, offset: int
    ) -> list[ScoredMemory]:
        """Two reads. The first lists the candidates -- each live, indexed memory's id and the
        name of its vectors, from an index, without reading rows -- and ranks them by vectors
        taken from the process's cache by name (those it lacks are read from the database).
        The second reads the best candidates whole, a chunk at a time in rank order, with
        their vectors *in the same statement*, and scores each again by them: a
        memory rewritten between the two reads is returned as it is now, scored as what it is
        now -- never a value with another version's vectors. It stops once no unread candidate
        could rank among the results."""
        import numpy as np

        listed = self._first_scores(wanted, scope)
        if listed is None:
            return []
        failpoint_between_search_reads(scope.session_id)
        ids, first = listed
        # Best first; equal scores in the order the memories were created (by id).
        order = np.lexsort((ids, -np.nan_to_num(first, nan=-np.inf)))
        ranked = order[~np.isnan(first[order])].tolist()
        needed = offset + limit
        chunk = min(max(2 * needed, 20) if not conditions else max(8 * needed, 200), 1000)
        # (score, id, result), kept sorted by (-score, id).
        found: list[tuple[float, int, ScoredMemory]] = []
        for start in range(0, len(ranked), chunk):
            chosen = [int(ids[at]) for at in ranked[start : start + chunk]]
            by_id = {row[0]: row for row in self._indexed_rows(scope, _RESULT_COLUMNS, chosen)}
            rows = [by_id[i] for i in chosen if i in by_id]
            # The vectors read in the same statement as the value (a few rows: no cache).
            vectors = [unpack(row[3], self.index.tag) for row in rows]
            scores = self.index.scores(wanted, vectors) if rows else []
            if Defect.SEARCH_KEEPS_FIRST_SCORES in self.defects:  # memcheck's self-test only
                listed_scores = {int(ids[at]): first[at] for at in ranked[start : start + chunk]}
                scores = [listed_scores[row[0]] for row in rows]
            for row, score in zip(rows, scores, strict=True):
                if np.isnan(score):
                    continue  # rewritten under another configuration meanwhile
                record = record_from_row(row[2], row[4:], score=float(score))
                assert isinstance(record, ScoredMemory)
                if not scope.keeps(record) or (
                    conditions and not matches(record.value, conditions)
                ):
                    continue
                found.append((record.score, row[0], record))
            found.sort(key=lambda item: (-item[0], item[1]))
            unread = start + chunk
            # Done when the next unread candidate ranks after the last result needed (it does
            # unless a result was rewritten meanwhile and scores lower now).
            if len(found) >= needed and (
                unread >= len(ranked)
                or (-found[needed - 1][0], found[needed - 1][1])
                < (-first[ranked[unread]], ids[ranked[unread]])
            ):
                break
        return [record for _, _, record in found[offset:needed]]

    def _first_scores(self, wanted: Any, scope: _Scope) -> tuple[Any, Any] | None:
        """Read 1: the candidates' ids (ascending) and their scores, or None if there is none.

        The vectors come as one matrix. The process keeps the last few (per session filter) with
        the names they were built from: a session searched again reuses its matrix, and after a
        few writes only the rows whose name changed are taken from the cache (or read)."""
        import numpy as np

        index = self.index
        listed = self._indexed_rows(scope, ("id", "embedding_key"))
        if not listed:
            return None
        pairs = np.array(listed, dtype=np.int64)
        pairs = pairs[np.argsort(pairs[:, 0])]
        ids, names = np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])
        cache = vector_cache()
        key = f"{self.using}|{index.tag}|{scope.sessions}|{scope.prefix}"
        kept = cache.stacked(key)
        todo = np.arange(len(ids))
        matrix = None
        if kept is not None and kept[2].shape[1] == index.dims:
            old_ids, old_names, old_matrix = kept
            at = np.minimum(np.searchsorted(old_ids, ids), len(old_ids) - 1)
            same = (old_ids[at] == ids) & (old_names[at] == names)
            if same.all() and len(ids) == len(old_ids):
                return ids, (old_matrix @ wanted).astype(np.float64)
            matrix = np.empty((len(ids), index.dims), dtype=np.float32)
            matrix[same] = old_matrix[at[same]]
            todo = np.nonzero(~same)[0]
        exact = True
        if len(todo):
            rows = [(int(ids[i]), int(names[i])) for i in todo]
            vectors, exact = self._vectors(rows, scope)
            fresh = index.stacked(vectors)
            if fresh is None:
                # Several texts per memory, or vectors of other dims, among them: each alone.
                pairs_ = list(zip(ids.tolist(), names.tolist(), strict=True))
                return ids, index.scores(wanted, self._vectors(pairs_, scope)[0])
            if matrix is None:
                matrix = fresh
            else:
                matrix[todo] = fresh
        if exact:
            cache.stack(key, ids, names, matrix)
        return ids, (matrix @ wanted).astype(np.float64)

    def _vectors(self, rows: list[tuple[Any, ...]], scope: _Scope) -> tuple[list[Any], bool]:
        """The vectors named by each row's ``(id, embedding_key, ...)``: from the process's
        cache, the rest read from the database -- by id, or, when many are missing (a cold
        cache), in one scan. A row rewritten since it was listed gets its new vectors (a search
        concurrent with the write may rank by either; its result is scored again anyway); a row
        gone since gets None, and so do vectors of another model (they are never compared).
        And whether every row got the vectors of its own name."""
        model = self.index.tag
        cache = vector_cache()
        vectors = cache.get_many([row[1] for row in rows], model)
        missing = [at for at, found in enumerate(vectors) if found is MISSING]
        if not missing:
            return vectors, True
        columns = ("id", "embedding_key", "embedding")
        ids = None if len(missing) > SCAN_PAST else [rows[at][0] for at in missing]
        by_id = {}
        for row_id, name, blob in self._indexed_rows(scope, columns, ids):
            matrix = unpack(blob, model)
            cache.put(name, matrix, model)
            by_id[row_id] = (name, matrix)
        exact = True
        for at in missing:
            name, vectors[at] = by_id.get(rows[at][0], (None, None))
            exact = exact and name == rows[at][1]
        return vectors, exact

    def _indexed_rows(
        self, scope: _Scope, columns: tuple[str, ...], ids: list[int] | None = None
    ) -> list[tuple[Any, ...]]:
        """The live, indexed memories' ``columns`` (``ids``: of these rows only), in no
        particular order (so that the search index alone can answer), as the driver returns
        them: values are decoded for the results only."""
        rows = Memory.objects.using(self.using)
        if Defect.SEARCH_IGNORES_EXPIRY in self.defects:
            rows = rows.filter(state=MemoryState.LIVE)
        else:
            rows = rows.live()
        connection = connections[self.using]
        rows = rows.filter(scope.sessions, embedding_key__isnull=False)
        if scope.prefix:
            rows = rows.filter(prefix_filter(connection, "key", scope.prefix))
        if ids is not None:
            rows = rows.filter(id__in=ids)
        return run_query(connection, rows.order_by().values_list(*columns))


class _Scope:
    """Which memories a search looks at: the session filter, and the exact prefixes it stands
    for (the filter may match more under a case-insensitive collation)."""

    __slots__ = ("prefix", "session_id", "session_prefix", "sessions")

    def __init__(
        self,
        sessions: Q,
        session_prefix: str | None,
        prefix: str | None,
        session_id: str | None = None,
    ) -> None:
        self.sessions, self.session_prefix, self.prefix = sessions, session_prefix, prefix
        self.session_id = session_id

    def keeps(self, record: ScoredMemory) -> bool:
        """The exact prefix tests once more, whatever the collation."""
        return has_prefix(record.session_id, self.session_prefix) and has_prefix(
            record.key, self.prefix
        )
