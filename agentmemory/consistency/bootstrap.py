"""Start-up of a spawned worker process. Imports nothing that needs the app registry, because it
runs before the task (which does) is unpickled."""

from __future__ import annotations


def setup_process(
    database: str, name: str, options: dict | None = None, overrides: dict | None = None
) -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    # The parent's settings that memcheck changed for the run (its own Redis for cache faults).
    for setting, value in (overrides or {}).items():
        setattr(settings, setting, value)

    # The parent may run on a database other than the settings' (a test database), with other
    # connection options (memcheck's client timeouts under node faults).
    connections[database].settings_dict["NAME"] = name
    if options is not None:
        connections[database].settings_dict["OPTIONS"] = options
