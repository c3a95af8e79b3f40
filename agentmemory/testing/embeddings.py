"""The deterministic test embedder, where a test project's settings name it:

    AGENTMEMORY = {"SEARCH": {"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64}}

It lives in :mod:`agentmemory.embedders` (memcheck's search workload uses it too, and memcheck sits
below the test tooling); these are the same objects.
"""

from ..embedders import DIMS, HashEmbedder, embed

__all__ = ["DIMS", "HashEmbedder", "embed"]
