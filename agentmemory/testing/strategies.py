"""Hypothesis strategies for the store's inputs, valid and invalid, for property tests of code
that uses agentmemory. Valid values round-trip unchanged on every supported database.

    from hypothesis import given
    from agentmemory.testing.strategies import session_ids, keys, json_values

    @given(session_ids(), keys(), json_values())
    def test_round_trip(memory_store, session_id, key, value): ...
"""

from __future__ import annotations

import unicodedata
from typing import Any

from hypothesis import strategies as st

from ..validation import BIDI_CONTROLS, KEY_MAX, SESSION_ID_MAX

__all__ = [
    "invalid_keys",
    "invalid_session_ids",
    "invalid_values",
    "json_values",
    "keys",
    "session_ids",
]

# Everything but control characters (Cc), lone surrogates (Cs), which no database stores, and
# the invisible characters the store refuses in ids (format characters -- bidirectional-text
# controls among them --, line and paragraph separators: they make one id display as another).
_NAME_CHARS = st.characters(exclude_categories=("Cc", "Cs", "Cf", "Zl", "Zp"))
# Characters an id never holds, wherever they stand.
_REFUSED = [*sorted(BIDI_CONTROLS), "\u200b", "\u00ad", "\ufeff", "\u2060", "\u2028", "\u2029"]
_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
# JSON numbers every backend returns unchanged: 53-bit integers, and finite floats below 1e15.
# PostgreSQL's jsonb keeps numbers as decimals: a float Python writes with an exponent, such as
# 3.947307830443209e+16, comes back as the integer 39473078304432090, which != the float.
_INTS = st.integers(min_value=-(2**53), max_value=2**53)
_FLOATS = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, width=64)


def session_ids(max_size: int = 32) -> st.SearchStrategy[str]:
    """Valid session ids: 1..max_size (<= 128) characters in NFC, any but control characters and
    invisible format characters -- including look-alikes such as ``%``, ``_``, trailing spaces
    and other cases."""
    return _names(min(max_size, SESSION_ID_MAX))


def keys(max_size: int = 32) -> st.SearchStrategy[str]:
    """Valid keys: 1..max_size (<= 255) characters in NFC, any but control characters and
    invisible format characters."""
    return _names(min(max_size, KEY_MAX))


def _names(limit: int) -> st.SearchStrategy[str]:
    # In Unicode normalization form NFC, as the store asks (NFC can lengthen a text a little).
    texts = st.text(_NAME_CHARS, min_size=1, max_size=limit)
    return texts.map(lambda text: unicodedata.normalize("NFC", text)).filter(
        lambda text: len(text) <= limit
    )


def json_values(max_leaves: int = 10) -> st.SearchStrategy[Any]:
    """JSON values the store accepts and returns unchanged."""
    scalars = st.none() | st.booleans() | _INTS | _FLOATS | _TEXT
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def _invalid_names(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.just(""),
        st.text(_NAME_CHARS, min_size=limit + 1, max_size=limit + 8),
        st.builds(
            lambda head, bad, tail: head + bad + tail,
            st.text(_NAME_CHARS, max_size=5),
            st.characters(categories=("Cc",)) | st.sampled_from(_REFUSED) | st.just("e\u0301"),
            st.text(_NAME_CHARS, max_size=5),
        ),
        st.none(),
        st.integers(),
        st.binary(min_size=1, max_size=8),
    )


def invalid_session_ids() -> st.SearchStrategy[Any]:
    """Session ids the store rejects with ``InvalidMemory`` (empty, too long, control characters,
    invisible format characters, not in NFC, not a str)."""
    return _invalid_names(SESSION_ID_MAX)


def invalid_keys() -> st.SearchStrategy[Any]:
    """Keys the store rejects with ``InvalidMemory``."""
    return _invalid_names(KEY_MAX)


def invalid_values() -> st.SearchStrategy[Any]:
    """Values the store rejects with ``InvalidMemory``: not JSON (NaN, infinities, bytes, sets,
    non-string keys, NUL characters)."""
    return st.one_of(
        st.sampled_from([float("nan"), float("inf"), float("-inf")]),
        st.binary(min_size=1, max_size=8),
        st.frozensets(st.integers(), min_size=1, max_size=3),
        st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=3),
        st.text(max_size=5).map(lambda s: s + "\x00"),
        st.lists(st.just(float("nan")), min_size=1, max_size=2),
    )
