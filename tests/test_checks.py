"""System checks: agentmemory.E001-E009, W001-W002, E010-E011."""

import pytest
from django.core.checks import Error

from agentmemory.checks import (
    check_settings,
    check_tidb_backend,
    database_warnings,
    tidb_backend_errors,
    tidb_errors,
)


def ids(messages):
    return [m.id for m in messages]


def test_unknown_setting_is_an_error(settings):
    settings.AGENTMEMORY = {"CACHE_ALIAS": "x"}
    messages = check_settings()
    assert ids(messages) == ["agentmemory.E001"]
    assert "CACHE_ALIAS" in messages[0].msg


def test_unknown_retry_setting_is_an_error(settings):
    settings.AGENTMEMORY = {"RETRY": {"TRIES": 3}}
    assert ids(check_settings()) == ["agentmemory.E008"]


@pytest.mark.parametrize(
    ("retry", "named"),
    [
        ({"ATTEMPTS": 0}, "ATTEMPTS"),
        ({"ATTEMPTS": "3"}, "ATTEMPTS"),
        ({"ATTEMPTS": True}, "ATTEMPTS"),
        ({"BASE_DELAY": -1}, "BASE_DELAY"),
        ({"MAX_DELAY": "0.5"}, "MAX_DELAY"),
        ({"RECONNECT": "yes"}, "RECONNECT"),
    ],
)
def test_bad_retry_values_are_errors_naming_the_value(settings, retry, named):
    settings.AGENTMEMORY = {"RETRY": retry}
    messages = check_settings()
    assert ids(messages) == ["agentmemory.E009"] and named in messages[0].msg


def test_unknown_database_and_cache_aliases_are_errors(settings):
    settings.AGENTMEMORY = {"DATABASE": "nope", "CACHE": "nope"}
    assert ids(check_settings()) == ["agentmemory.E002", "agentmemory.E003"]


def test_bad_default_ttl_and_size_are_errors(settings):
    settings.AGENTMEMORY = {"DEFAULT_TTL": -5, "MAX_VALUE_BYTES": 0}
    assert ids(check_settings()) == ["agentmemory.E004", "agentmemory.E005"]


def test_valid_settings_pass(settings):
    settings.AGENTMEMORY = {"DEFAULT_TTL": 60, "RETRY": {"ATTEMPTS": 3}}
    assert check_settings() == []


def test_sqlite_without_immediate_transactions_warns_with_the_fix():
    messages = database_warnings(
        "default", {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.db"}
    )
    assert ids(messages) == ["agentmemory.W001"]
    assert "IMMEDIATE" in messages[0].hint


def test_sqlite_with_immediate_transactions_passes():
    database = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "x.db",
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
    assert database_warnings("default", database) == []


def test_mysql_without_read_committed_warns():
    assert ids(
        database_warnings("default", {"ENGINE": "django.db.backends.mysql", "NAME": "x"})
    ) == ["agentmemory.W002"]


@pytest.mark.django_db(databases="__all__")  # Django 6.1: check runs database checks too
def test_the_project_settings_pass_every_check():
    from django.core.management import call_command

    call_command("check", "--fail-level", "WARNING")


def test_tidb_optimistic_mode_is_an_error_with_the_fix():
    errors = tidb_errors("default", (7, 5, 0), "optimistic")
    assert ids(errors) == ["agentmemory.E011"]
    assert isinstance(errors[0], Error) and "pessimistic" in errors[0].hint


def test_old_tidb_is_an_error():
    assert ids(tidb_errors("default", (6, 1, 0), "pessimistic")) == ["agentmemory.E010"]


def test_recent_pessimistic_tidb_passes():
    assert tidb_errors("default", (8, 5, 1), "") == []
    assert tidb_errors("default", (6, 5, 0), "pessimistic") == []


def test_cache_protection_off_and_a_sharded_cache_are_errors(settings):
    settings.CACHES = {
        **settings.CACHES,
        "sharded": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/2"],
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"},
        },
    }
    settings.AGENTMEMORY = {"CACHE": "sharded", "CACHE_PROTECTION": False}
    assert sorted(ids(check_settings())) == ["agentmemory.E014", "agentmemory.E015"]


@pytest.mark.parametrize(
    "retention",
    [{"KEEP_LAST": 0}, {"KEEP_LAST": "5"}, {"KEEP_DAYS": 0}, {"KEEP_DAYS": True}, {"KEEP": 5}],
)
def test_bad_history_retention_is_an_error(settings, retention):
    settings.AGENTMEMORY = {"HISTORY_RETENTION": retention}
    assert ids(check_settings()) == ["agentmemory.E016"]


@pytest.mark.parametrize(
    ("tidb", "django", "ok"),
    [
        ("5.2.1", "5.2.19", True),
        ("6.0.1", "6.0.10", True),
        ("6.0.1", "5.2.19", False),  # pip's newest on Python 3.12, beside Django 5.2
        ("5.2.1", "6.1.3", False),
        (None, "6.1.3", False),
    ],
)
def test_django_tidb_must_match_the_django_line(tidb, django, ok):
    errors = tidb_backend_errors(tidb, django)
    assert (errors == []) is ok
    if not ok:
        assert ids(errors) == ["agentmemory.E017"]
        assert f"django-tidb~={'.'.join(django.split('.')[:2])}.0" in errors[0].hint


def test_the_tidb_backend_check_looks_at_the_installed_packages(settings):
    from importlib.metadata import PackageNotFoundError, version

    import django

    try:
        installed = version("django-tidb")
    except PackageNotFoundError:  # agentmemory[tidb] not installed: E017 says so
        installed = None
    settings.DATABASES = {**settings.DATABASES, "tidb": {"ENGINE": "django_tidb"}}
    assert check_tidb_backend() == tidb_backend_errors(installed, django.get_version())


@pytest.mark.parametrize(
    ("search", "named"),
    [
        ("agentmemory.testing.embeddings.embed", "SEARCH"),
        ({"DIMS": 64}, "EMBED is missing"),
        ({"EMBED": "agentmemory.testing.embeddings.embed"}, "DIMS is missing"),
        ({"EMBED": "agentmemory.testing.embeddings.nothing", "DIMS": 64}, "cannot be imported"),
        ({"EMBED": 42, "DIMS": 64}, "EMBED must be"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 0}, "DIMS"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": "64"}, "DIMS"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "FIELDS": "text"}, "FIELDS"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "FIELDS": ["a..b"]}, "a..b"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "TIMEOUT": 0}, "TIMEOUT"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "MODEL": 5}, "MODEL must"),
        ({"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64, "MODELS": "x"}, "'MODELS'"),
    ],
)
def test_a_bad_search_index_is_an_error_naming_what_is_wrong(settings, search, named):
    settings.AGENTMEMORY = {"SEARCH": search}
    messages = check_settings()
    assert ids(messages) == ["agentmemory.E019"]
    assert named in messages[0].msg


def test_a_good_search_index_passes(settings):
    settings.AGENTMEMORY = {
        "SEARCH": {
            "EMBED": "agentmemory.testing.embeddings.embed",
            "DIMS": 64,
            "FIELDS": ["text", "notes[*].body", "tags[0]"],
            "TIMEOUT": None,
        }
    }
    assert check_settings() == []


@pytest.mark.parametrize(
    ("agentmemory", "check_id", "named"),
    [
        (["CACHE"], "agentmemory.E021", "must be a dict"),
        ("default", "agentmemory.E021", "must be a dict"),
        ({"RETRY": 5}, "agentmemory.E008", "must be a dict"),
        ({"RETRY": {"DEADLINE": 0}}, "agentmemory.E009", "DEADLINE"),
        ({"RETRY": {"DEADLINE": "30"}}, "agentmemory.E009", "DEADLINE"),
        ({"HISTORY_RETENTION": "x"}, "agentmemory.E016", "must be a dict"),
        ({"HISTORY_RETENTION": {"KEEP_DAYS": 10**6}}, "agentmemory.E016", "KEEP_DAYS"),
        ({"CACHE_FENCE_SECONDS": "1"}, "agentmemory.E007", "CACHE_FENCE_SECONDS"),
        ({"CACHE_MAX_ENTRY_SECONDS": -1}, "agentmemory.E007", "CACHE_MAX_ENTRY_SECONDS"),
        ({"CACHE_FENCE_SECONDS": float("inf")}, "agentmemory.E007", "CACHE_FENCE_SECONDS"),
        ({"MAX_VALUE_BYTES": 1.5}, "agentmemory.E005", "MAX_VALUE_BYTES"),
        ({"CAUSAL_READS": "no"}, "agentmemory.E022", "CAUSAL_READS"),
        ({"OPENTELEMETRY": 1}, "agentmemory.E022", "OPENTELEMETRY"),
        ({"TELEMETRY_RAW_IDS": "yes"}, "agentmemory.E022", "TELEMETRY_RAW_IDS"),
        ({"DATABASE": ["default"]}, "agentmemory.E002", "DATABASE"),
        ({"CACHE": ["x"]}, "agentmemory.E003", "CACHE"),
    ],
)
def test_settings_of_the_wrong_type_are_errors_and_no_check_raises(
    settings, agentmemory, check_id, named
):
    from django.core.checks import run_checks

    settings.AGENTMEMORY = agentmemory
    messages = check_settings()
    assert ids(messages) == [check_id], messages
    assert named in messages[0].msg
    # Every registered check (the database ones too) answers: none raises.
    assert check_id in ids(run_checks(include_deployment_checks=True))


def test_a_cache_that_is_not_django_redis_is_an_error(settings):
    settings.CACHES = {
        **settings.CACHES,
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    settings.AGENTMEMORY = {"CACHE": "local"}
    assert ids(check_settings()) == ["agentmemory.E006"]


def test_each_settings_check_is_registered_on_its_own():
    from django.core.checks import registry

    from agentmemory.checks import SETTINGS_CHECKS

    registered = set(registry.registry.get_checks())
    assert set(SETTINGS_CHECKS) <= registered


GALERA_OK = {
    "binlog_format": "ROW",
    "innodb_autoinc_lock_mode": "2",
    "wsrep_local_state_comment": "Synced",
}


@pytest.mark.parametrize(
    ("status", "causal", "expected"),
    [
        (GALERA_OK, True, []),
        ({**GALERA_OK, "binlog_format": "STATEMENT"}, True, ["agentmemory.E012"]),
        (GALERA_OK, False, ["agentmemory.E013"]),
        ({**GALERA_OK, "innodb_autoinc_lock_mode": "1"}, True, ["agentmemory.W003"]),
        ({**GALERA_OK, "wsrep_local_state_comment": "Joining"}, True, ["agentmemory.W004"]),
    ],
)
def test_galera_node_settings_that_break_a_guarantee_are_reported(status, causal, expected):
    from agentmemory.checks import galera_errors

    assert ids(galera_errors("node", status, causal)) == expected


NUMPY_MISSING = """
import sys
sys.modules["numpy"] = None  # what an interpreter without numpy finds: no spec, no import
import django
from django.core.checks import run_checks
from django.test.utils import override_settings
django.setup()
search = {"EMBED": "agentmemory.testing.embeddings.embed", "DIMS": 64}
with override_settings(AGENTMEMORY={"SEARCH": search}):
    errors = [m for m in run_checks() if m.id.startswith("agentmemory.")]
    print([m.id for m in errors], errors[0].hint if errors else "")
with override_settings(AGENTMEMORY={"SEARCH": None}):
    print([m.id for m in run_checks() if m.id.startswith("agentmemory.")])
"""


def test_a_search_index_without_numpy_is_an_error_with_the_install_line():
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    done = subprocess.run(
        [sys.executable, "-c", NUMPY_MISSING], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    with_index, without = done.stdout.splitlines()
    assert with_index == "['agentmemory.E020'] pip install 'django-agentmemory[search]'"
    assert without == "[]"


@pytest.mark.parametrize(
    ("synchronous_commit", "multi_host", "standbys", "expected"),
    [
        ("on", False, [], []),
        ("remote_apply", True, ["sync"], []),
        ("off", False, [], ["agentmemory.W005"]),
        ("local", False, ["sync"], ["agentmemory.W005"]),
        ("on", True, ["async"], ["agentmemory.W007"]),
        ("on", True, ["sync", "potential"], ["agentmemory.W007"]),
        ("on", False, ["async"], []),  # one host: no failover through this alias
        ("off", True, ["async"], ["agentmemory.W005", "agentmemory.W007"]),
    ],
)
def test_postgres_settings_that_lose_acknowledged_commits_are_reported(
    synchronous_commit, multi_host, standbys, expected
):
    from agentmemory.checks import postgres_durability_warnings

    found = postgres_durability_warnings("db", synchronous_commit, multi_host, standbys)
    assert ids(found) == expected


@pytest.mark.parametrize(
    ("flush_log", "sync_binlog", "log_bin", "expected"),
    [
        ("1", "0", "0", []),  # MariaDB's defaults: no binary log
        ("1", "1", "1", []),
        ("2", "1", "1", ["agentmemory.W006"]),
        ("0", "0", "0", ["agentmemory.W006"]),
        ("1", "0", "1", ["agentmemory.W006"]),
    ],
)
def test_mysql_settings_that_lose_acknowledged_commits_are_reported(
    flush_log, sync_binlog, log_bin, expected
):
    from agentmemory.checks import mysql_durability_warnings

    assert ids(mysql_durability_warnings("db", flush_log, sync_binlog, log_bin)) == expected


@pytest.mark.django_db
def test_the_suites_servers_acknowledge_only_durable_commits():
    """The servers `make test` runs keep their durable defaults (the HA cluster's asynchronous
    standby is W007, tested in tests/test_pg_ha.py)."""
    from django.db import connection

    from agentmemory.checks import check_durable_commits

    found = ids(check_durable_commits(databases=["default"]))
    multi_host = "," in str(connection.settings_dict.get("HOST") or "")
    assert found == (["agentmemory.W007"] if multi_host else [])


def test_columns_without_their_exact_collation_are_an_error():
    from agentmemory.checks import exact_column_errors

    assert exact_column_errors("db", "utf8mb4_nopad_bin", []) == []
    (error,) = exact_column_errors(
        "db",
        "utf8mb4_nopad_bin",
        [("agentmemory_memoryversion", "request_id", "utf8mb4_general_ci")],
    )
    assert error.id == "agentmemory.E023"
    assert "agentmemory_memoryversion.request_id (utf8mb4_general_ci)" in error.msg
    assert "COLLATE utf8mb4_nopad_bin" in error.hint


@pytest.mark.server
@pytest.mark.django_db(transaction=True)
def test_a_request_id_column_created_with_a_case_insensitive_collation_is_found():
    """A table created by hand (or converted by ALTER TABLE ... CONVERT TO): E023 names the
    column; the migrated tables pass."""
    from django.db import connection

    from agentmemory.checks import check_exact_columns
    from agentmemory.vendors import exact_collation

    if connection.vendor != "mysql":
        assert check_exact_columns(databases=["default"]) == []
        return
    assert check_exact_columns(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE agentmemory_logevent MODIFY request_id varchar(68) NOT NULL "
            "COLLATE utf8mb4_general_ci"
        )
    try:
        (error,) = check_exact_columns(databases=["default"])
        assert error.id == "agentmemory.E023"
        assert "agentmemory_logevent.request_id (utf8mb4_general_ci)" in error.msg
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE agentmemory_logevent MODIFY request_id varchar(68) NOT NULL "
                f"COLLATE {exact_collation(connection)}"
            )
    assert check_exact_columns(databases=["default"]) == []
