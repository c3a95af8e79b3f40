"""Semantic 9: bad input gets a clear error that names what was wrong, and changes nothing."""

import math
from datetime import timedelta

import pytest

from agentmemory import InvalidMemory
from agentmemory.models import Memory, MemoryVersion

pytestmark = pytest.mark.django_db

BAD_IDS = [
    ("", "1 to"),
    ("x" * 129, "1 to 128"),
    ("a\x00b", "control"),
    ("a\nb", "control"),
    ("tab\there", "control"),
    ("\ud800", "lone surrogates"),
    ("live\u202eevil", "bidirectional"),
    ("\u2066isolate", "bidirectional"),
    # Look-alike ids (each displays as another): NFD beside NFC, invisible format characters,
    # line separators.
    ("cafe\u0301", "NFC"),
    ("zero\u200bwidth", "U\\+200B ZERO WIDTH SPACE"),
    ("soft\u00adhyphen", "U\\+00AD SOFT HYPHEN"),
    ("tag\U000e0041", "U\\+E0041 TAG"),
    ("line\u2028sep", "line or paragraph separators"),
    ("\ufeffbom", "U\\+FEFF"),
    ("ad\u200dmin", "ZERO WIDTH JOINER"),
    ("ad\u200cmin", "ZERO WIDTH NON-JOINER"),
    (42, "must be a str"),
    (None, "must be a str"),
]

BAD_VALUES = [
    (math.nan, "NaN"),
    (math.inf, "NaN or Infinity"),
    ({"a": [1, -math.inf]}, r"\$\.a\[1\]"),
    (b"bytes", "bytes"),
    ({1, 2}, "set"),
    ({1: "int key"}, "keys are strings"),
    (object(), "not JSON"),
    ("nul\x00inside", "NUL"),
]


def nothing_written():
    return not Memory.objects.exists() and not MemoryVersion.objects.exists()


@pytest.mark.parametrize(("session_id", "message"), BAD_IDS)
def test_bad_session_id_is_rejected(store, session_id, message):
    with pytest.raises(InvalidMemory, match=message) as info:
        store.remember(session_id, "k", 1)
    assert info.value.field == "session_id"
    assert nothing_written()


@pytest.mark.parametrize(
    ("key", "message"), [(k, m) for k, m in BAD_IDS if k != "x" * 129] + [("k" * 256, "1 to 255")]
)
def test_bad_key_is_rejected(store, key, message):
    with pytest.raises(InvalidMemory, match=message) as info:
        store.remember("s", key, 1)
    assert info.value.field == "key"
    assert nothing_written()


def test_longest_allowed_ids_are_accepted(store):
    record = store.remember("s" * 128, "k" * 255, 1)
    assert store.recall("s" * 128, "k" * 255).version == record.version


@pytest.mark.parametrize(("value", "message"), BAD_VALUES)
def test_non_json_value_is_rejected(store, value, message):
    with pytest.raises(InvalidMemory, match=message) as info:
        store.remember("s", "k", value)
    assert info.value.field == "value"
    assert nothing_written()


def test_oversize_value_is_rejected_naming_the_limit(store, settings):
    settings.AGENTMEMORY = {"MAX_VALUE_BYTES": 100}
    from agentmemory import MemoryStore

    small = MemoryStore(cache=None)
    small.remember("s", "k", "x" * 90)
    with pytest.raises(InvalidMemory, match="over the limit of 100"):
        small.remember("s", "k", "x" * 101)
    assert len(small.history("s", "k")) == 1


def test_value_size_counts_utf8_bytes(store, settings):
    settings.AGENTMEMORY = {"MAX_VALUE_BYTES": 10}
    from agentmemory import MemoryStore

    with pytest.raises(InvalidMemory, match="bytes"):
        MemoryStore(cache=None).remember("s", "k", "ééééé")  # 5 chars, 12 bytes with quotes


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        -1,
        math.nan,
        math.inf,
        "10",
        True,
        1e-7,  # rounds to zero: it would have meant "never expires"
        0.0009,
        1e30,
        2**63,
        pytest.param(10**400, id="10**400"),
        1e12,
        timedelta.max,
        timedelta(microseconds=1),
        -timedelta(seconds=1),
    ],
)
def test_bad_ttl_is_rejected(store, ttl):
    with pytest.raises(InvalidMemory) as info:
        store.remember("s", "k", 1, ttl=ttl)
    assert info.value.field == "ttl"
    assert nothing_written()


@pytest.mark.parametrize("expected", [-1, "1", 1.5, True])
def test_bad_expected_version_is_rejected(store, expected):
    with pytest.raises(InvalidMemory, match="expected_version"):
        store.remember("s", "k", 1, expected_version=expected)
    assert nothing_written()


def test_update_result_is_validated_and_nothing_is_written(store):
    store.remember("s", "k", [1])
    with pytest.raises(InvalidMemory, match="set"):
        store.update("s", "k", lambda v: {1, 2})
    assert store.recall("s", "k").value == [1]
    assert len(store.history("s", "k")) == 1


def test_remember_many_validates_every_item_before_writing(store):
    with pytest.raises(InvalidMemory, match="NaN"):
        store.remember_many("s", {"a": 1, "b": math.nan})
    assert nothing_written()


def test_revert_to_missing_version_is_rejected(store):
    store.remember("s", "k", 1)
    with pytest.raises(InvalidMemory, match="no version 5"):
        store.revert("s", "k", 5)
    with pytest.raises(InvalidMemory, match="version"):
        store.revert("s", "k", 0)
    assert len(store.history("s", "k")) == 1


def test_revert_to_a_forget_is_rejected(store):
    store.remember("s", "k", 1)
    store.forget("s", "k")
    with pytest.raises(InvalidMemory, match="is a forget"):
        store.revert("s", "k", 2)


def test_recall_many_rejects_keys_and_prefix_together(store):
    with pytest.raises(InvalidMemory, match="not both"):
        store.recall_many("s", ["a"], prefix="a")
    with pytest.raises(InvalidMemory, match="single str"):
        store.recall_many("s", "abc")


def test_values_round_trip_as_json(store):
    value = {"text": "héllo ✓ 😀", "n": [1, 2.5, None, True], "nested": {"t": (1, 2)}}
    record = store.remember("s", "k", value)
    assert record.value == {
        "text": "héllo ✓ 😀",
        "n": [1, 2.5, None, True],
        "nested": {"t": [1, 2]},
    }
    assert store.recall("s", "k").value == record.value


def test_returned_value_is_a_copy(store):
    value = {"items": [1]}
    record = store.remember("s", "k", value)
    value["items"].append(2)
    record.value["items"].append(3)
    assert store.recall("s", "k").value == {"items": [1]}


def test_ttl_limits_are_accepted_at_both_ends(store):
    assert store.remember("s", "short", 1, ttl=0.001).expires_at is not None
    longest = store.remember("s", "long", 1, ttl=100 * 365 * 24 * 3600)
    assert longest.expires_at.year >= 2100
    assert store.recall("s", "long").version == 1


def nested(depth):
    value = 1
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


def test_values_nested_to_the_limit_are_stored_on_every_backend(store):
    store.remember("s", "deep", nested(30))
    assert store.recall("s", "deep").value == nested(30)
    assert store.recall_many("s")["deep"].value == nested(30)
    assert store.history("s", "deep")[0].value == nested(30)


@pytest.mark.parametrize("depth", [31, 980, 100_000])
def test_values_nested_past_the_limit_are_rejected_whatever_the_stack(store, depth):
    with pytest.raises(InvalidMemory, match="deeper than the limit of 30"):
        store.remember("s", "deep", nested(depth))
    with pytest.raises(InvalidMemory, match="deeper than the limit of 30"):
        store.update("s", "deep", lambda _: nested(depth))
    assert nothing_written()


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("\ud800", "lone surrogates"),
        ("a\x00", "control"),
        ("a\nb", "control"),
        ("x" * 256, "0 to 255"),
        (3, "must be a str"),
    ],
)
def test_recall_many_prefix_is_validated_like_a_key(store, prefix, message):
    store.remember("s", "a", 1)
    with pytest.raises(InvalidMemory, match=message) as error:
        store.recall_many("s", prefix=prefix)
    assert error.value.field == "prefix"


def test_empty_prefix_means_every_key(store):
    store.remember("s", "a", 1)
    assert list(store.recall_many("s", prefix="")) == ["a"]


@pytest.mark.parametrize("batch", [0, pytest.param(10**30, id="10**30"), 100_001, "10"])
def test_purge_batch_is_bounded(store, batch):
    with pytest.raises(InvalidMemory, match="batch"):
        store.purge_expired(batch=batch)


@pytest.mark.parametrize(
    "text",
    [
        "café",  # NFC
        "👨\u200d👩\u200d👧",  # a family: zero-width joiners between emoji
        "👍🏽\u200d👍",  # with a skin tone
        "❤\ufe0f\u200d🔥",  # with a variation selector
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian: a zero-width non-joiner after a letter that needs it
        "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # England's flag
        "user/42 with spaces",
    ],
)
def test_ids_that_text_needs_are_accepted(store, text):
    store.remember(text, text, 1)
    assert store.recall(text, text).value == 1


def test_an_nfd_id_and_its_nfc_twin_are_never_two_memories(store):
    store.remember("café", "k", "nfc")
    with pytest.raises(InvalidMemory, match="NFC"):
        store.remember("cafe\u0301", "k", "nfd")
    assert list(Memory.objects.values_list("session_id", flat=True)) == ["café"]


@pytest.mark.parametrize("version", [2**63, 10**30])
def test_a_version_past_the_columns_range_is_refused_on_every_call(store, version):
    store.remember("s", "k", 1)
    calls = [
        lambda: store.remember("s", "k", 2, expected_version=version),
        lambda: store.recall("s", "k", version=version),
        lambda: store.history("s", "k", limit=5, before_version=version),
        lambda: store.revert("s", "k", version),
        lambda: store.forget("s", "k", expected_version=version),
    ]
    for call in calls:
        with pytest.raises(InvalidMemory, match=r"<= 9223372036854775807"):
            call()
    assert MemoryVersion.objects.count() == 1


def test_the_largest_version_is_accepted_as_an_expected_version(store):
    from agentmemory import VersionConflict
    from agentmemory.validation import VERSION_MAX

    with pytest.raises(VersionConflict):
        store.remember("s", "k", 1, expected_version=VERSION_MAX)
    assert nothing_written()


def test_remember_many_names_the_key_whose_value_is_bad(store):
    with pytest.raises(InvalidMemory, match=r"value: of key 'c': \$ is nan") as info:
        store.remember_many("s", {"a": 1, "b": 2, "c": math.nan})
    assert info.value.field == "value"
    assert nothing_written()


def test_the_admin_display_of_a_stored_look_alike_id_spells_its_invisible_characters():
    from agentmemory.validation import visible

    assert visible("zero\u200bwidth") == "zero\\u200bwidth"
    assert visible("tag\U000e0041") == "tag\\U000e0041"
    assert visible("live\u202eevil") == "live\\u202eevil"
    assert visible("👨\u200d👩") == "👨\u200d👩"  # what an id may hold stays as it is
