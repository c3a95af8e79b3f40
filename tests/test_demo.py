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
