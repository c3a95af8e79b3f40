"""``manage.py demo``: the superuser and sample memories a new user looks at in the admin."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from agentmemory import MemoryStore

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_creates_a_superuser_and_memories_with_history_once(admin_client):
    call_command("demo", "--username", "demo", "--password", "pw")
    call_command("demo", "--username", "demo", "--password", "pw")  # idempotent
    assert User.objects.get(username="demo").is_superuser
    store = MemoryStore(cache=None)
    assert [v.version for v in store.history("demo-agent-1", "preferences")] == [1, 2, 3]
    assert store.recall("demo-agent-1", "preferences").value == {"language": "fr", "tone": "formal"}
    assert store.recall("demo-agent-2", "scratchpad") is None
    page = admin_client.get("/admin/agentmemory/memory/").content.decode()
    assert "demo-agent-1" in page and "demo-agent-2" in page
    # A record of every kind the admin shows: a log, the SDK's session, ADK's, a LangGraph thread.
    assert [i.value["tool"] for i in store.read_log("demo-agent-1", "tool-calls")] == [
        "search_flights"
    ]
    assert len(store.read_log("demo-agent-1", "openai-agents")) == 3
    logs = admin_client.get("/admin/agentmemory/log/").content.decode()
    assert "tool-calls" in logs and "openai-agents" in logs and "adk-events" in logs
    threads = admin_client.get("/admin/agentmemory/checkpointthread/").content.decode()
    assert "demo-trip" in threads
