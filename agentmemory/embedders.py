"""A deterministic, dependency-free embedder for tests of semantic recall: no model, no network,
the same vectors in every process and on every machine.

Each word (lower-cased ``\\w+``) is hashed (BLAKE2b) to one of ``dims`` dimensions with a sign;
a text's vector is the sum over its words. Texts that share words are close, texts that share none
are orthogonal (up to hash collisions) -- enough to rank memories by meaning in a test, and to
check a search's scores exactly.

    AGENTMEMORY = {"SEARCH": {"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64}}
    MemoryStore(index=Index(embed=HashEmbedder(dims=32), dims=32, fields=["text"]))

(``agentmemory.testing.embeddings`` hands on these names, for test settings; memcheck's search
workload imports them from here.)
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["DIMS", "HashEmbedder", "embed"]

#: The dimensions of :func:`embed`.
DIMS = 64
_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Callable as ``embedder(texts)``, and a LangChain-style ``embed_documents`` /
    ``embed_query`` pair. ``calls`` counts the texts it was asked to embed."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self.calls = 0

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += len(texts)
        return [self.vector(text) for text in texts]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self(texts)

    def embed_query(self, text: str) -> list[float]:
        return self([text])[0]

    def vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for word in _WORD.findall(text.lower()):
            digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
            vector[digest % self.dims] += 1.0 if digest >> 63 else -1.0
        return vector


_DEFAULT = HashEmbedder()


def embed(texts: list[str]) -> list[list[float]]:
    """:class:`HashEmbedder` of :data:`DIMS` dimensions, as a plain function (a dotted path)."""
    return _DEFAULT(texts)
