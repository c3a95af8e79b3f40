from django.apps import AppConfig


class AgentMemoryConfig(AppConfig):
    name = "agentmemory"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, conf  # noqa: F401  (registers checks and the settings receiver)
