from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The readiness view (docs/observability.md): GET agentmemory/status.
    path("agentmemory/", include("agentmemory.urls")),
]
