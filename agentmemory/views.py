"""The readiness view: :func:`agentmemory.health.status` as JSON, HTTP 200 when the memory is
ready or degraded (it serves: from the database alone, or with invalidations to replay), 503
when it is down. Include it where a probe reaches it and the public does not::

    # urls.py
    path("agentmemory/", include("agentmemory.urls")),  # GET agentmemory/status
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .conf import get_config
from .health import DOWN
from .health import status as memory_status


@never_cache
@require_GET
def status(request: HttpRequest) -> JsonResponse:
    report = memory_status(get_config()["DATABASE"])
    return JsonResponse(report, status=503 if report["code"] == DOWN else 200)
