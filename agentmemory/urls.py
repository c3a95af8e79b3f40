"""``include("agentmemory.urls")``: the readiness view (``status``)."""

from django.urls import path

from . import views

app_name = "agentmemory"
urlpatterns = [path("status", views.status, name="status")]
