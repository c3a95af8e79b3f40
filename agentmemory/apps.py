from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AgentMemoryConfig(AppConfig):
    name = "agentmemory"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from . import checks, conf  # noqa: F401  (registers checks and the settings receiver)

        connection_created.connect(_connected, dispatch_uid="agentmemory.causal_reads")
        post_migrate.connect(_flushed, sender=self, dispatch_uid="agentmemory.flushed")


def _flushed(sender: Any, using: str, **kwargs: Any) -> None:
    """``post_migrate``, sent after ``flush`` (a test database's teardown included) and after
    ``migrate``: the Redis tier drops what it holds of that database."""
    from .cache import forget_flushed_database

    forget_flushed_database(using)


def _connected(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Every new connection: on a Galera node, reads made causal (``AGENTMEMORY["CAUSAL_READS"]``);
    lock waits bounded by ``AGENTMEMORY["RETRY"]["DEADLINE"]``; on PostgreSQL, the database's
    epoch and the durability of the session's COMMITs learnt, in the same round trip."""
    from .conf import get_config
    from .defects import failpoint_session_setup
    from .vendors import bound_lock_wait, make_reads_causal, setup_postgres_session

    config = get_config()
    try:
        failpoint_session_setup()
        if connection.vendor == "mysql" and config["CAUSAL_READS"]:
            make_reads_causal(connection)
        deadline = config["RETRY"].get("DEADLINE")
        if connection.vendor == "postgresql":
            setup_postgres_session(connection, deadline)
        elif deadline is not None:
            bound_lock_wait(connection, deadline)
    except BaseException:
        # Django keeps a connection whose connection_created receiver raised: the next call
        # would use it without its session settings (on a Galera node: reads that are not
        # causal, so an idempotent retry could miss its own committed write). Closed instead:
        # the next call opens a new one and sets it up.
        connection.close()
        raise
