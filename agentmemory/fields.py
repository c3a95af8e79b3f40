"""A CharField that compares exactly on every database.

MySQL/MariaDB/TiDB default collations are case- and accent-insensitive, and their ``_bin``
collations still ignore trailing spaces (PAD SPACE): sessions ``"Alice"``, ``"alice"`` and
``"alice "`` would share one row there. Isolation (contract semantic 5) needs exact equality, so on
the MySQL family the column gets a binary NO PAD collation; SQLite and PostgreSQL compare exactly
already.
"""

from __future__ import annotations

from typing import Any

from django.db import models


def exact_collation(connection: Any) -> str | None:
    if connection.vendor != "mysql":
        return None
    if getattr(connection, "display_name", "") == "TiDB":
        # TiDB's new collation framework: utf8mb4_bin is PAD SPACE as in MySQL, and TiDB >= 7.4
        # adds utf8mb4_0900_bin (NO PAD). Older TiDB falls back to utf8mb4_bin.
        return "utf8mb4_0900_bin" if connection.tidb_version >= (7, 4) else "utf8mb4_bin"
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin"


class ExactCharField(models.CharField):
    """CharField whose equality and uniqueness are byte-exact on every backend."""

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        params = super().db_parameters(connection)
        params["collation"] = self.db_collation or exact_collation(connection)
        return params
