"""LlamaIndex's chat store (#45): ``AgentMemoryChatStore`` keeps what LlamaIndex's own tests of
``SimpleChatStore`` pin (llama-index-core tests/storage/chat_store/test_simple_chat_store.py:
order, insert at a position, delete all / one / the last, out-of-range positions, keys in
order), works under ``ChatMemoryBuffer``, and keeps what the in-memory and key-value stores lose
under concurrency -- on every database, with threads."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.core.storage.chat_store.base_db import MessageStatus

from agentmemory import InvalidMemory, MemoryStore
from agentmemory.integrations.llamaindex import AgentMemoryChatStore, AgentMemoryDBChatStore
from agentmemory.models import Log

from .conftest import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


@pytest.fixture(params=["agentmemory", "simple"])
def chat_store(request):
    """Ours, and LlamaIndex's own in-memory store: the behaviour tests hold for both."""
    if request.param == "simple":
        return SimpleChatStore()
    return AgentMemoryChatStore(store=MemoryStore(cache=None))


# ---------------------------------------------------------------------- SimpleChatStore's behaviour


def test_messages_are_kept_per_key_in_order_and_inserted_at_a_position(chat_store):
    for key in ("user1", "user2"):
        chat_store.add_message(key, user("hello"))
        chat_store.add_message(key, user("world"))
    assert chat_store.get_messages("user1") == [user("hello"), user("world")]
    assert chat_store.get_messages("user2") == [user("hello"), user("world")]
    assert chat_store.get_keys() == ["user1", "user2"]
    chat_store.add_message("user1", user("first"), idx=0)
    chat_store.add_message("user1", user("before last"), idx=-1)
    assert chat_store.get_messages("user1") == [
        user("first"),
        user("hello"),
        user("before last"),
        user("world"),
    ]
    assert chat_store.get_messages("nobody") == []


def test_delete_messages_removes_one_key_and_returns_its_messages(chat_store):
    chat_store.add_message("user1", user("hello"))
    chat_store.add_message("user2", user("hello"))
    assert chat_store.delete_messages("user1") == [user("hello")]
    assert chat_store.get_messages("user1") == []
    assert chat_store.get_messages("user2") == [user("hello")]
    assert chat_store.get_keys() == ["user2"]
    assert chat_store.delete_messages("never") is None


def test_delete_last_and_by_position(chat_store):
    for text in ("a", "b", "c"):
        chat_store.add_message("u", user(text))
    assert chat_store.delete_last_message("u") == user("c")
    assert chat_store.delete_message("u", 0) == user("a")
    assert chat_store.get_messages("u") == [user("b")]
    assert chat_store.delete_message("u", 5) is None
    assert chat_store.delete_message("nobody", 0) is None
    assert chat_store.get_messages("u") == [user("b")]
    assert chat_store.delete_last_message("u") == user("b")
    assert chat_store.get_messages("u") == []


def test_delete_last_of_an_empty_or_missing_chat_is_none():
    """LlamaIndex's test pins None for an emptied history (SimpleChatStore of llama-index-core
    0.14.25 raises IndexError there; fixed after it)."""
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    chat_store.add_message("u", user("hello"))
    assert chat_store.delete_last_message("u") == user("hello")
    assert chat_store.delete_last_message("u") is None
    assert chat_store.delete_last_message("nobody") is None


def test_an_out_of_range_negative_position_deletes_nothing():
    """LlamaIndex's newer SimpleChatStore answers None; ours does too (-len..len-1 only)."""
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    chat_store.add_message("u", user("hello"))
    assert chat_store.delete_message("u", -2) is None
    assert chat_store.delete_message("u", -1) == user("hello")
    assert chat_store.get_messages("u") == []


def test_set_messages_replaces_the_whole_chat(chat_store):
    chat_store.add_message("u", user("old"))
    chat_store.set_messages("u", [user("x"), user("y")])
    assert chat_store.get_messages("u") == [user("x"), user("y")]
    chat_store.set_messages("u", [])
    assert chat_store.get_messages("u") == []


def test_messages_round_trip_with_their_extras():
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    message = ChatMessage(
        role="assistant", content="ハロー héllo", additional_kwargs={"tool_calls": [{"id": "1"}]}
    )
    chat_store.add_message("u", message)
    assert chat_store.get_messages("u") == [message]
    assert AgentMemoryChatStore(store=MemoryStore(cache=None)).get_messages("u") == [message]


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.set_messages("u", "hello"), "messages"),
        (lambda s: s.set_messages("u", [user("ok"), "hello"]), r"messages\[1\]"),
        (lambda s: s.set_messages("u", {"role": "user"}), "messages"),
        (lambda s: s.add_message("u", {"role": "user", "content": "x"}), "message"),
        (lambda s: s.add_message("u", user("x"), idx="0"), "idx"),
        (lambda s: s.add_message("u", user("x"), idx=True), "idx"),
        (lambda s: s.delete_message("u", 0.0), "idx"),
        (lambda s: s.add_message("", user("x")), "stream"),
        (lambda s: s.add_message("e\u0301", user("x")), "stream"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(call, field):
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    chat_store.add_message("u", user("kept"))
    with pytest.raises(InvalidMemory, match=f"^{field}: "):
        call(chat_store)
    assert chat_store.get_messages("u") == [user("kept")]
    assert chat_store.get_keys() == ["u"]


def test_keys_that_differ_in_case_accent_or_trailing_space_are_other_chats():
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    keys = ["u", "U", "u ", "é", "e"]
    for key in keys:
        chat_store.add_message(key, user(key))
    assert chat_store.get_keys() == keys
    assert [chat_store.get_messages(k) for k in keys] == [[user(k)] for k in keys]


def test_a_session_id_the_store_refuses_is_refused_at_construction():
    with pytest.raises(InvalidMemory, match=r"^session_id: "):
        AgentMemoryChatStore(session_id="", store=MemoryStore(cache=None))


# ---------------------------------------------------------------------- under LlamaIndex


def test_it_is_the_chat_store_of_a_chat_memory_buffer():
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    memory = ChatMemoryBuffer.from_defaults(
        chat_store=chat_store, chat_store_key="user-42", token_limit=10_000
    )
    memory.put(user("my name is Ada"))
    memory.put(ChatMessage(role="assistant", content="hello Ada"))
    again = ChatMemoryBuffer.from_defaults(
        chat_store=AgentMemoryChatStore(store=MemoryStore(cache=None)),
        chat_store_key="user-42",
        token_limit=10_000,
    )
    assert [m.content for m in again.get()] == ["my name is Ada", "hello Ada"]
    memory.reset()
    assert again.get_all() == [] and chat_store.get_keys() == []


def test_the_async_methods_run_on_the_stores_pool():
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))

    async def main() -> list:
        await asyncio.gather(*(chat_store.async_add_message("u", user(str(n))) for n in range(8)))
        await chat_store.async_add_message("u", user("first"), idx=0)
        last = await chat_store.adelete_last_message("u")
        first = await chat_store.adelete_message("u", 0)
        keys = await chat_store.aget_keys()
        await chat_store.aset_messages("v", [user("x")])
        return [last is not None, first, keys, await chat_store.aget_messages("v")]

    has_last, first, keys, v = asyncio.run(main())
    assert has_last and first == user("first") and keys == ["u"] and v == [user("x")]
    assert len(chat_store.get_messages("u")) == 7
    assert asyncio.run(chat_store.adelete_messages("v")) == [user("x")]


# ---------------------------------------------------------------------- concurrency


def test_concurrent_adds_are_all_kept_once_in_each_writers_order():
    """8 threads x 10 add_message to one chat: 80 messages, none lost (SimpleChatStore's
    read-modify-write of a persisted list, and the key-value stores', keep one of two)."""
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))

    def writer(n: int) -> None:
        for i in range(10):
            chat_store.add_message("u", user(f"{n}-{i}"))

    run_threads(writer, 8)
    texts = [m.content for m in chat_store.get_messages("u")]
    assert sorted(texts) == sorted(f"{n}-{i}" for n in range(8) for i in range(10))
    for n in range(8):
        assert [t for t in texts if t.startswith(f"{n}-")] == [f"{n}-{i}" for i in range(10)]


def test_concurrent_delete_last_never_returns_one_message_twice():
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    chat_store.set_messages("u", [user(str(n)) for n in range(40)])

    def popper(_n: int) -> list:
        got = []
        while (message := chat_store.delete_last_message("u")) is not None:
            got.append(message.content)
        return got

    popped = [text for got in run_threads(popper, 6) for text in got]
    assert sorted(popped, key=int) == [str(n) for n in range(40)]


def test_inserts_and_removals_by_position_racing_with_adds_lose_nothing():
    """Half the threads add, half insert at the front and remove at position 1: every added
    message is there once, every insert too, minus exactly what the removals returned."""
    chat_store = AgentMemoryChatStore(store=MemoryStore(cache=None))
    chat_store.set_messages("u", [user("seed-0"), user("seed-1")])

    def worker(n: int) -> list:
        removed = []
        for i in range(8):
            if n % 2:
                chat_store.add_message("u", user(f"add-{n}-{i}"))
            else:
                chat_store.add_message("u", user(f"front-{n}-{i}"), idx=0)
                gone = chat_store.delete_message("u", 1)
                removed.append(gone.content)
        return removed

    removed = [text for got in run_threads(worker, 6) for text in got]
    left = [m.content for m in chat_store.get_messages("u")]
    written = ["seed-0", "seed-1"]
    written += [f"add-{n}-{i}" for n in (1, 3, 5) for i in range(8)]
    written += [f"front-{n}-{i}" for n in (0, 2, 4) for i in range(8)]
    assert sorted(left + removed) == sorted(written)
    assert Log.objects.filter(stream="u").count() == 1


# ---------------------------------------------------------------------- Memory's AsyncDBChatStore


def db_store() -> AgentMemoryDBChatStore:
    return AgentMemoryDBChatStore(store=MemoryStore(cache=None))


def test_the_db_chat_store_keeps_active_and_archived_messages_apart():
    chat = db_store()
    archived = MessageStatus.ARCHIVED

    async def main() -> list:
        await chat.add_messages("k", [user(str(n)) for n in range(5)])
        await chat.add_message("k", user("old"), status=archived)
        moved = await chat.archive_oldest_messages("k", 2)
        return [
            moved,
            await chat.get_messages("k"),
            await chat.get_messages("k", status=archived),
            await chat.get_messages("k", status=None, offset=1, limit=3),
            await chat.count_messages("k"),
            await chat.count_messages("k", status=None),
            await chat.get_keys(),
        ]

    moved, now, old, page, count, total, keys = asyncio.run(main())
    assert moved == [user("0"), user("1")]
    assert now == [user("2"), user("3"), user("4")]
    assert old == [user("old"), user("0"), user("1")]
    assert page == [user("0"), user("1"), user("2")]
    assert (count, total, keys) == (3, 6, ["k"])


def test_the_db_chat_store_replaces_deletes_and_takes_the_oldest_at_once():
    chat = db_store()

    async def main() -> list:
        await chat.add_messages("k", [user("a"), user("b"), user("c")])
        await chat.add_message("k", user("x"), status=MessageStatus.ARCHIVED)
        taken = await chat.delete_oldest_messages("k", 1)
        second = await chat.delete_message("k", 1)
        missing = await chat.delete_message("k", 7)
        await chat.set_messages("k", [user("new")])
        after_set = await chat.get_messages("k", status=None)
        await chat.delete_messages("k", status=MessageStatus.ACTIVE)
        emptied = await chat.count_messages("k", status=None)
        return [taken, second, missing, after_set, emptied, await chat.get_keys()]

    taken, second, missing, after_set, emptied, keys = asyncio.run(main())
    assert taken == [user("a")] and second == user("c") and missing is None
    assert after_set == [user("new")]  # set_messages replaced the archive too, as SQL's does
    assert emptied == 0 and keys == []


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.add_messages("k", "hello"), "messages"),
        (lambda c: c.add_message("k", user("x"), status="gone"), "status"),
        (lambda c: c.get_messages("k", limit=-1), "limit"),
        (lambda c: c.get_messages("k", offset="1"), "offset"),
        (lambda c: c.archive_oldest_messages("k", -1), "n"),
        (lambda c: c.delete_message("k", "0"), "idx"),
    ],
)
def test_the_db_chat_store_names_bad_input_and_changes_nothing(call, field):
    chat = db_store()
    asyncio.run(chat.add_message("k", user("kept")))
    with pytest.raises(InvalidMemory, match=f"^{field}: "):
        asyncio.run(call(chat))
    assert asyncio.run(chat.get_messages("k", status=None)) == [user("kept")]


def test_it_is_the_store_of_llamaindexs_memory_which_archives_past_its_budget():
    """``Memory`` keeps the chat under a token budget by archiving the oldest messages: with
    ours, what it archived is still there, and nothing is lost or repeated."""
    chat = db_store()
    memory = Memory.from_defaults(
        session_id="user-42", chat_store=chat, token_limit=60, token_flush_size=20
    )
    for n in range(12):
        memory.put(user(f"message number {n} with a few words in it"))
    shown_now = [m.content for m in memory.get()]
    everything = asyncio.run(chat.get_messages("user-42", status=None))
    assert [m.content for m in everything] == [
        f"message number {n} with a few words in it" for n in range(12)
    ]
    assert asyncio.run(chat.count_messages("user-42", status=MessageStatus.ARCHIVED)) > 0
    assert shown_now and shown_now[-1] == everything[-1].content


def test_archiving_racing_with_adds_loses_and_repeats_nothing():
    chat = db_store()
    asyncio.run(chat.add_messages("k", [user(f"seed-{n}") for n in range(10)]))

    def worker(n: int) -> None:
        for i in range(8):
            if n % 2:
                asyncio.run(chat.add_message("k", user(f"{n}-{i}")))
            else:
                asyncio.run(chat.archive_oldest_messages("k", 2))

    run_threads(worker, 6)
    every = [m.content for m in asyncio.run(chat.get_messages("k", status=None))]
    expected = [f"seed-{n}" for n in range(10)] + [f"{n}-{i}" for n in (1, 3, 5) for i in range(8)]
    assert sorted(every) == sorted(expected)
    for n in (1, 3, 5):
        assert [t for t in every if t.startswith(f"{n}-")] == [f"{n}-{i}" for i in range(8)]
