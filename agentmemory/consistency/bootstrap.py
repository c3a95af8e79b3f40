"""Start-up of a spawned worker process. Imports nothing that needs the app registry, because it
runs before the task (which does) is unpickled."""

from __future__ import annotations


def setup_process(database: str, name: str, options: dict | None = None) -> None:
    import django

    django.setup()
    from django.db import connections

    # The parent may run on a database other than the settings' (a test database), with other
    # connection options (memcheck's client timeouts under node faults).
    connections[database].settings_dict["NAME"] = name
    if options is not None:
        connections[database].settings_dict["OPTIONS"] = options
