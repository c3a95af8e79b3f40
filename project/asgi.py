"""The demo project as an ASGI application: Django, and the MCP server at /mcp
(agentmemory.integrations.mcp.with_django; docs/mcp.md). ``uvicorn project.asgi:application``."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django_app = get_asgi_application()

from agentmemory.integrations.mcp import with_django  # noqa: E402

application = with_django(django_app)
