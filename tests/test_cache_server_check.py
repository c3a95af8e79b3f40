"""A misconfigured Redis is found before it costs anything: ``manage.py check`` reports a server
that answers with an error (``redis://host/99``: a database index out of range) as an error
naming the URL, one that does not answer as a warning, and memcheck exits 2 with one line
within seconds (#42: the check passed, and memcheck died with a raw ResponseError traceback
after 14 s)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from agentmemory.checks import check_cache_server

pytestmark = pytest.mark.django_db


def cache_at(location: str) -> dict:
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25},
    }


def tier(location: str) -> override_settings:
    return override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "tier": cache_at(location),
        },
        AGENTMEMORY={"CACHE": "tier"},
    )


def redis_location() -> str:
    from django.conf import settings

    return settings.CACHES["agentmemory"]["LOCATION"]


def test_a_database_index_the_server_does_not_have_is_an_error_naming_the_url():
    base = redis_location().rsplit("/", 1)[0]
    with tier(f"{base}/99"):
        (error,) = check_cache_server()
    assert error.id == "agentmemory.E024"
    assert f"{base}/99" in error.msg and "DB index is out of range" in error.msg


def test_a_redis_that_does_not_answer_is_a_warning_that_shows_no_password():
    with tier("redis://user:s3cret@127.0.0.1:1/0"):  # nothing listens on port 1
        (warning,) = check_cache_server()
    assert warning.id == "agentmemory.W009"
    assert "redis://user:***@127.0.0.1:1/0" in warning.msg and "s3cret" not in warning.msg


def test_the_suites_redis_passes():
    with tier(redis_location()):
        assert check_cache_server() == []


@pytest.mark.django_db(transaction=True)
def test_memcheck_exits_2_with_one_line_within_seconds_on_a_misconfigured_redis():
    base = redis_location().rsplit("/", 1)[0]
    with tier(f"{base}/99"), pytest.raises(CommandError) as info:
        call_command("memcheck", "--ops", "10")
    assert info.value.returncode == 2
    message = str(info.value)
    assert "\n" not in message and f"{base}/99" in message and "misconfigured" in message
