"""The semantic index of memcheck's ``search`` workload: the deterministic test embedder, whatever
the project configured -- memcheck checks the store and the database, not a model, and calls no
model. The checker recomputes every score it was given from the value returned."""

from __future__ import annotations

import importlib.util
import math
from functools import cache
from typing import Any

from ..embedders import HashEmbedder
from ..semantic import Index

DIMS = 64
FIELD = "text"
#: The words of the texts written and searched for.
WORDS = ("cat", "dog", "bird", "fish", "horse", "tree", "river", "stone", "cloud", "fire")
#: A search score may differ this much from the recomputed one (float32 storage).
SCORE_TOLERANCE = 1e-4


def available() -> bool:
    """numpy scores the vectors: without it, there is no search workload."""
    return importlib.util.find_spec("numpy") is not None


@cache
def memcheck_index() -> Index:
    return Index(embed=HashEmbedder(DIMS), dims=DIMS, fields=(FIELD,), timeout=None)


def expected_score(
    query: str, value: Any, *, dims: int = DIMS, fields: tuple[str, ...] = (FIELD,)
) -> float | None:
    """The score ``value`` must get for ``query`` from a :class:`HashEmbedder` index of ``dims``
    over ``fields`` (memcheck's by default): the best cosine similarity of the query's vector to
    its texts' (None: the value has no text to index), in plain Python -- independent of the
    store's numpy scoring and of its stored vectors."""
    embedder = HashEmbedder(dims)

    def unit(vector: list[float]) -> list[float]:
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    texts = Index(embed=embedder, dims=dims, fields=fields).texts(value)
    if not texts:
        return None
    wanted = unit(embedder.vector(query))
    return max(
        sum(a * b for a, b in zip(wanted, unit(embedder.vector(t)), strict=True)) for t in texts
    )
