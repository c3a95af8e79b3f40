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

from .vendors import exact_collation


class ExactCharField(models.CharField):
    """CharField whose equality and uniqueness are byte-exact on every backend."""

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        params = super().db_parameters(connection)
        params["collation"] = self.db_collation or exact_collation(connection)
        return params
