"""The Redis cache tier: fast recall that is never stale and never expired.

The store talks to it through three calls -- ``read_through`` (Redis first, the database for the
rest, under the protocol below), ``written`` and ``erased`` (after a commit) -- and is correct
without it. Three mechanisms keep a cached answer from ever being older than an
acknowledged write (contract semantic 7):

* **Versioned entries.** An entry holds the memory's version (a forgotten or expired memory is
  cached as absent, with its version). A write's after-commit update replaces the entry only with a
  newer version, so a late update can never roll an entry back.

* **Fill leases.** A reader that misses gets a lease token in the same round trip, then reads the
  database, then fills -- only if its lease still exists. Every write's update deletes the key's
  lease, so a fill computed from a database read that a later write overtook is rejected. A lease
  lost to eviction or a flush only costs a miss, never a wrong answer.

* **A fence for outages.** Readers trust Redis only while a fence key (short TTL, fetched in the
  same round trip as the entry) exists. A writer that cannot update Redis after its commit
  records the key in the database (``PendingInvalidation``) and waits until no fence that predates
  that record can still be alive before it acknowledges; the first write of an outage pays at most
  one fence period. A reader that finds no fence falls back to the database and renews the fence
  only when nothing is pending; otherwise it first replays the pending keys from the database. A
  renewal sets the fence's expiry from the Redis clock read *before* the pending check, so a
  renewal racing with a new pending record cannot outlive the writer's wait. Redis coming back
  with old contents (a paused server resumed, a restart) therefore serves nothing until replayed.

* **Entries bound to a server process.** Redis can acknowledge a write and lose it: a restart
  from an RDB snapshot or an AOF that missed the last second, a replica promoted by Sentinel
  before it received the write. Every entry records the ``run_id`` of the server process that
  stored it, and a read trusts it only on the server process that stored it: whatever a
  restarted server reloaded, or a promoted replica received, was stored by another process and
  is a miss, refilled from the database under a lease. The fence a snapshot restores is
  therefore harmless. ``FLUSHALL`` and eviction only delete (misses). A warm read is one plain
  ``MGET`` of the fence and the entries, judged here against the ``run_id`` its connection
  learned (``INFO server`` on that connection when it opened, again after every reconnect: a
  TCP connection cannot outlive the process it was opened to); anything else -- a miss, a
  tombstone, another stamp, no fence -- is read again by the read script, which compares with
  the current ``run_id`` itself (``INFO server`` inside it) and takes the fill leases.

* **Entries bound to a database epoch.** A database can lose writes it acknowledged too: a
  PostgreSQL failover to an asynchronous standby. Every entry also records the epoch of the
  database it came from (:func:`agentmemory.vendors.epoch`: the timeline, which each promotion
  moves forward, read when a connection opens -- and a failover always breaks connections), and
  the fence holds the epoch of the reader that renewed it: an entry is trusted only under a fence
  of its own epoch. The first write or renewal of a newer epoch deletes an older epoch's fence,
  and a renewal of an older one (a client still reaching a demoted primary) is refused, so after
  a failover nothing cached before it is served. Between the promotion and that first contact,
  no fence is left to trust as long as ``CACHE_FENCE_SECONDS`` is shorter than the time the HA
  manager takes to promote (Patroni: ``ttl - loop_wait - retry_timeout``, 10 s by default).

* **Tombstones before a commit.** Under its row locks, just before COMMIT, a write turns each of
  its entries into a tombstone of the version it is committing: readers miss, and fills of older
  versions are rejected by the version comparison. The after-commit update replaces it. A writer
  that dies between COMMIT and its update leaves a tombstone (a miss for at most
  :data:`TOMBSTONE_MS`), never the older version. If Redis cannot take the tombstones, the keys
  are recorded as pending in the write's own transaction, so they survive the writer.

``CACHE_PROTECTION=False`` (a declared seam, system check E014) turns the identity check, the
tombstones and the pending records off, for the tests that show memcheck catches what they
prevent. Counters (``stats``) record hits, misses, fills, rejected fills, errors and replays.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DatabaseError
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.dispatch import receiver
from django.utils import timezone

from . import clock, telemetry
from .conf import get_config
from .defects import (
    FRACTURED_GAP_SECONDS,
    SLOW_FILL_SECONDS,
    Defect,
    Defects,
    failpoint_before_fill,
    failpoint_before_load,
    failpoint_before_renewal,
    failpoint_tombstones,
)
from .defects import NONE as NO_DEFECTS
from .errors import MemoryUnavailable
from .models import MemoryState, PendingInvalidation, is_live
from .records import MemoryRecord
from .vendors import commit_unconfirmed, database_identity, epoch, insert_if_missing

logger = logging.getLogger("agentmemory.cache")

#: How long a cache miss waits for the reader holding the key's fill lease before it reads the
#: database itself (a lease holder that died costs its followers at most this).
HOT_KEY_WAIT_SECONDS = 0.25
#: The most keys one read fills (the rest of a large miss is read from the database, uncached).
FILLS_PER_CALL = 100
#: How long a write's tombstone lives if its writer never updates it (rolled back, or died): the
#: key is a miss that long. It must outlast the time from the mark to the COMMIT.
TOMBSTONE_MS = 3_000

# An entry is "<version>|<run_id>/<epoch>|<payload>": the version first, so the scripts compare it
# without decoding JSON; the stamp: the run_id of the Redis server process that stored it, so an
# entry that outlived its server (restored from a snapshot or an AOF, replicated before a Redis
# failover) is never trusted, and the epoch of the database it was read from or written to
# (vendors.epoch: PostgreSQL's timeline), so an entry cached before a database failover is never
# trusted after it; the payload is JSON, or "~" for a write in progress (a tombstone: this version
# is being committed, nothing older may be filled). Written and read only by these scripts and
# this module.
#
# The current server's run_id changes at every restart and differs on a promoted replica: read it
# from INFO (only when there is an entry to judge, or one to write).
RUN_ID = "string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')"

# The fence holds the epoch of the database whose reader renewed it: a reader trusts an entry
# only if it is stamped with this server's run_id and the fence's epoch. The epoch key (no TTL)
# holds the newest epoch any writer or renewal has seen: a renewal or a write of an older epoch
# (a client still on a demoted primary) is refused, and the first write or renewal of a newer
# one deletes a fence of an older epoch -- from then on no entry cached before the failover is
# served, whatever it holds. Epochs are hexadecimal (PostgreSQL's timelines), compared as
# numbers. Formatted with the fence's and the epoch key's KEYS and the caller's epoch: the
# script returns 0 when the caller's epoch is older than the newest seen.
ADVANCE_EPOCH = """
local newest = redis.call('GET', {epoch_key})
local mine = tonumber({epoch}, 16)
if newest and tonumber(newest, 16) > mine then return 0 end
if newest ~= {epoch} then redis.call('SET', {epoch_key}, {epoch}) end
local fenced = redis.call('GET', {fence})
local fenced_epoch = fenced and string.match(fenced, '^[^#]*')
if fenced_epoch and fenced_epoch ~= {epoch} and (tonumber(fenced_epoch, 16) or 0) < mine then
  redis.call('DEL', {fence})
end
"""

# KEYS: entry, fence, lease. ARGV: new lease token, lease ms, flags: first '1' if a lease may be
# taken, second '1' to trust only this server's entries ('0' only with CACHE_PROTECTION off).
# Returns {trusted entry or false, fence present, redis time ms, lease token or false}. An entry
# stamped by another server process or with another epoch than the fence's, or a tombstone, is
# no entry: the reader misses and may fill.
READ_SCRIPT = f"""
local fenced = redis.call('GET', KEYS[2])
local fence = fenced and 1 or 0
local entry = redis.call('GET', KEYS[1])
if entry then
  local who, kind = string.match(entry, '^%d+|([^|]*)|(.)')
  if kind == '~' or (string.sub(ARGV[3], 2, 2) == '1' and who ~= {RUN_ID} .. '/' .. (fenced or '')) then
    entry = false
  end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = false
if not entry and fence == 1 and string.sub(ARGV[3], 1, 1) == '1' then
  local lineage = string.match(fenced, '#(.*)$') or '0'
  if redis.call('SET', KEYS[3], ARGV[1] .. '#' .. lineage, 'NX', 'PX', ARGV[2]) then
    lease = ARGV[1]
  end
end
return {{entry or false, fence, now_ms, lease}}
"""

# The read of several keys, in one script so that it sees Redis at one instant: a remember_many's
# tombstones go in in one script (MARK_SCRIPT), so such a read sees all of them or none. KEYS:
# fence, then each key's entry and lease. ARGV: lease ms, flags as READ_SCRIPT's second ('1':
# trust only this server's entries), then each key's new lease token and '1' if it may take a
# lease. Returns {fence present, redis time ms, then each key's trusted entry or false and its
# lease token or false}.
READ_MANY_SCRIPT = f"""
local fenced = redis.call('GET', KEYS[1])
local fence = fenced and 1 or 0
local t = redis.call('TIME')
local out = {{fence, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}}
local me = nil
for i = 1, (#KEYS - 1) / 2 do
  local entry = redis.call('GET', KEYS[2 * i])
  if entry then
    local who, kind = string.match(entry, '^%d+|([^|]*)|(.)')
    if kind == '~' then
      entry = false
    elseif ARGV[2] == '1' then
      me = me or ({RUN_ID} .. '/' .. (fenced or ''))
      if who ~= me then entry = false end
    end
  end
  local lease = false
  if not entry and fence == 1 and ARGV[2 + 2 * i] == '1' then
    local lineage = string.match(fenced, '#(.*)$') or '0'
    if redis.call('SET', KEYS[2 * i + 1], ARGV[1 + 2 * i] .. '#' .. lineage, 'NX', 'PX', ARGV[1]) then
      lease = ARGV[1 + 2 * i]
    end
  end
  out[#out + 1] = entry or false
  out[#out + 1] = lease
end
return out
"""

# The lineage (KEYS[5] below, no TTL, absent: 0) is the third part of every stamp: bumping it
# makes every entry of the database a miss at once -- what a fence renewal does when it finds
# that the database went back in time, and what ``forget_everything`` does. A fill lease holds
# the lineage it was taken under (READ_SCRIPT), so a fill read from the database before a bump
# is rejected after it.
#
# Every entry stored is noted in the "recent" set (KEYS[6]; ARGV[6]: the member, '' for none),
# which the next fence renewal checks against the database (CAPTURE_SCRIPT). A set grown past
# ARGV[7] members (no reader renewed the fence for long) is not checked: the lineage is bumped
# instead, which leaves nothing stored before it to check.
NOTE_RECENT = """
if ARGV[6] ~= '' and redis.call('SCARD', KEYS[6]) >= tonumber(ARGV[7]) then
  lineage = tostring(redis.call('INCR', KEYS[5]))
  redis.call('DEL', KEYS[6], KEYS[3])
end
"""

# KEYS: entry, lease, fence, epoch key, lineage, recent. ARGV: version, payload, ttl ms, lease
# token ('' for a write's update), the database epoch it was read from or written to, the recent
# member, the recent set's bound. A write's update (no token) deletes the lease, so fills begun
# before it are rejected. Returns 1 if stored, 0 if rejected: older than this server's entry of
# this epoch and lineage (or than its tombstone), the lease is gone or of an older lineage, or
# the epoch is older than the newest seen. Another server's, epoch's or lineage's entry is
# replaced whatever its version.
_PUT_LEASE = """
local lineage = redis.call('GET', KEYS[5]) or '0'
local token = ARGV[4]
if token ~= '' then
  if redis.call('GET', KEYS[2]) ~= token .. '#' .. lineage then return 0 end
end
redis.call('DEL', KEYS[2])
"""
_PUT_VERSION = """
local current = redis.call('GET', KEYS[1])
if current then
  local v, who, kind = string.match(current, '^(%d+)|([^|]*)|(.)')
  v = tonumber(v)
  if who == me and v and (v > new or (v == new and kind ~= '~')) then return 0 end
end
"""
_PUT_STORE = """
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. me .. '|' .. ARGV[2], 'PX', ARGV[3])
if ARGV[6] ~= '' then redis.call('SADD', KEYS[6], ARGV[6]) end
return 1
"""


def _put_script(*, lease: bool = True, version: bool = True) -> str:
    """PUT_SCRIPT; memcheck's self-test variants drop one of its two checks of a fill: the
    lease (FILL_IGNORES_LEASE) or the version (FILL_IGNORES_VERSION, for fills only)."""
    lease_check = (
        _PUT_LEASE if lease else _PUT_LEASE.replace("if token ~= '' then", "if false then")
    )
    version_check = _PUT_VERSION if version else f"if ARGV[4] == '' then{_PUT_VERSION}end\n"
    return (
        lease_check
        + ADVANCE_EPOCH.format(epoch_key="KEYS[4]", epoch="ARGV[5]", fence="KEYS[3]")
        + NOTE_RECENT
        + f"""
local me = {RUN_ID} .. '/' .. ARGV[5] .. '#' .. lineage
local new = tonumber(ARGV[1])
"""
        + version_check
        + _PUT_STORE
    )


PUT_SCRIPT = _put_script()
FILL_IGNORES_VERSION_SCRIPT = _put_script(version=False)
FILL_IGNORES_LEASE_SCRIPT = _put_script(lease=False)

# The FILL_WITHOUT_LEASE defect's fill (memcheck's self-test only): a plain SET, as a naive
# cache-aside reader does it. Same keys and arguments as PUT_SCRIPT.
SET_SCRIPT = f"""
local lineage = redis.call('GET', KEYS[5]) or '0'
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. {RUN_ID} .. '/' .. ARGV[5] .. '#' .. lineage .. '|' .. ARGV[2], 'PX', ARGV[3])
if ARGV[6] ~= '' then redis.call('SADD', KEYS[6], ARGV[6]) end
return 1
"""

# Before a write commits, under its row locks. KEYS: fence, epoch key, lineage, then the
# entries. ARGV: tombstone ttl ms, the database epoch, then the version each key is about to
# commit. Each entry becomes a tombstone of that version: readers miss and can fill only that
# version or newer, so a writer that dies between its commit and its update leaves a miss, never
# an older version to trust. A writer of an older epoch than the newest seen marks nothing (its
# entries are never trusted) and gets 0.
MARK_SCRIPT = (
    ADVANCE_EPOCH.format(epoch_key="KEYS[2]", epoch="ARGV[2]", fence="KEYS[1]")
    + f"""
local me = {RUN_ID} .. '/' .. ARGV[2] .. '#' .. (redis.call('GET', KEYS[3]) or '0')
for i = 4, #KEYS do
  local key = KEYS[i]
  local new = tonumber(ARGV[i - 1])
  local current = redis.call('GET', key)
  local v, who = false, false
  if current then v, who = string.match(current, '^(%d+)|([^|]*)|') end
  if not (who == me and tonumber(v) >= new) then
    redis.call('SET', key, ARGV[i - 1] .. '|' .. me .. '|~', 'PX', ARGV[1])
  end
end
return 1
"""
)

# A reader's renewal of the fence. KEYS: fence, epoch key, lineage, incarnation. ARGV: the epoch
# of the database the reader just read, the fence's expiry (Redis clock ms), '1' if the database
# went back in time (bump the lineage: nothing cached of it before is trusted), the database's
# incarnation counter to publish ('' for none; kept if lower than the one Redis holds). The fence
# holds "<epoch>#<lineage>". Refused (0) if a newer epoch was seen.
RENEW_SCRIPT = (
    ADVANCE_EPOCH.format(epoch_key="KEYS[2]", epoch="ARGV[1]", fence="KEYS[1]")
    + """
if ARGV[3] == '1' then redis.call('INCR', KEYS[3]) end
if ARGV[4] ~= '' and tonumber(ARGV[4]) > tonumber(redis.call('GET', KEYS[4]) or '0') then
  redis.call('SET', KEYS[4], ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. (redis.call('GET', KEYS[3]) or '0'), 'PXAT', ARGV[2])
return 1
"""
)

# A renewal's first step. KEYS: recent, checking, lineage, incarnation. Moves what was stored
# since the last capture into the checking set (which keeps what a renewal that failed or died
# did not finish) and returns {the checking set's members, the lineage, the incarnation counter
# Redis holds, this server's run_id}.
CAPTURE_SCRIPT = f"""
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('SUNIONSTORE', KEYS[2], KEYS[2], KEYS[1])
  redis.call('DEL', KEYS[1])
end
return {{redis.call('SMEMBERS', KEYS[2]), redis.call('GET', KEYS[3]) or '0',
         redis.call('GET', KEYS[4]) or '0', {RUN_ID}}}
"""

# A repair's deletion of one entry the database does not back. KEYS: entry, lease. ARGV: the
# entry as it was compared: deleted (with the lease) only if it is still that one.
DROP_IF_SAME_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
"""

# Distrust everything cached of the database at once. KEYS: fence, lineage.
FORGET_SCRIPT = """
redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
return 1
"""

#: The most entries stored between two fence renewals that the next one checks; past it the
#: lineage is bumped instead (NOTE_RECENT).
RECENT_BOUND = 50_000
#: Pending invalidations a renewal reads and replays at once.
PENDING_BATCH = 1000
#: Keys per round trip when a renewal checks entries against the database.
CHECK_CHUNK = 500

#: On Redis Cluster the sessions are spread over this many groups. A group's names -- its sessions'
#: entries and fill leases, and its own fence, epoch, lineage, incarnation, recent and checking
#: names -- share one hash tag, so one slot: every script and the warm ``MGET`` stay on one node,
#: and every protection above holds per group (a failover or a slot migration costs that group's
#: entries, never anything stale). On one Redis (or Sentinel's) there is one group, and the names
#: are those of earlier releases.
CLUSTER_GROUPS = 16


class Group:
    """The Redis names of one group of sessions: everything a script about one session touches."""

    __slots__ = (
        "checking",
        "epoch",
        "fence",
        "incarnation",
        "lineage",
        "prefix",
        "recent",
    )

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.fence = f"{prefix}fence"
        self.epoch = f"{prefix}epoch"
        self.lineage = f"{prefix}lineage"
        self.incarnation = f"{prefix}incarnation"
        self.recent = f"{prefix}recent"
        self.checking = f"{prefix}checking"

    def __repr__(self) -> str:
        return f"Group({self.prefix!r})"


@functools.lru_cache(maxsize=65_536)
def group_index(session_id: str, groups: int = CLUSTER_GROUPS) -> int:
    """The group of ``session_id`` among ``groups``: the same in every process (BLAKE2b; a
    process keeps its 65,536 most recent answers)."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8, person=b"agentmemory-grp").digest()
    return int.from_bytes(digest, "big") % groups


#: After a fence renewal that failed (a conflict on the counter's row, a lost connection), the
#: next one this process tries waits this long (at most the fence period): meanwhile its recalls
#: read the database, rather than each one trying again.
RENEWAL_BACKOFF_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class CachedRead:
    """What Redis said about one key."""

    trusted: bool  # a fence was present: a hit can be believed
    record: MemoryRecord | None = None
    hit: bool = False  # a believed entry (record None: the memory is absent at that version)
    lease: str | None = None  # a miss with the right to fill
    redis_ms: int = 0
    # A miss whose lease another reader holds: its fill may come soon, worth a short wait.
    contended: bool = False


class MemoryCache:
    """The cache tier for one cache alias (django-redis) and one database alias."""

    def __init__(
        self, alias: str, using: str, *, namespace: str | None = None, defects: Defects = NO_DEFECTS
    ) -> None:
        from django.core.cache import caches

        config = get_config()
        self.alias = alias
        self.using = using
        self.namespace = namespace
        self.fence_seconds: float = config["CACHE_FENCE_SECONDS"]
        self.max_entry_ms = int(config["CACHE_MAX_ENTRY_SECONDS"] * 1000)
        self.lease_ms = 5000
        self._base = f"{caches[alias].make_key('agentmemory')}:" + (
            f"{namespace}:" if namespace else ""
        )
        self._prefix: str | None = None
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._groups_down: dict[str, float] = {}  # on a cluster: a group's prefix -> until
        self._renew_after = 0.0  # a renewal that failed: the next try not before (monotonic)
        self._outage = False
        self._scripts: dict[str, Any] = {}
        #: Planted bugs (:mod:`agentmemory.defects`), for memcheck's self-test only.
        self.defects = defects
        self._client: tuple[Any, int] = (None, -1)
        self._groups: list[Group] | None = None

    # ------------------------------------------------------------------ keys

    @property
    def prefix(self) -> str:
        """Every Redis name of this tier starts with this: the cache's own prefix and version,
        the namespace (the test plugin gives each test one of its own), then the identity of the
        database it caches (asked once), so two databases sharing one Redis never meet."""
        if self._prefix is None:
            from django.db import connections

            identity = database_identity(connections[self.using])
            self._prefix = f"{self._base}db-{identity}:"
        return self._prefix

    def _token(self) -> str:
        """A lease token unique across processes (a random prefix) and calls (a counter):
        cheaper than asking the OS for randomness on every read."""
        return f"{_TOKEN_PREFIX}{next(_TOKENS)}"

    def _hash(self, session_id: str, key: str) -> str:
        return _digest(session_id, key)

    def entry_key(self, session_id: str, key: str) -> str:
        return self._names(session_id, key)[0]

    def lease_key(self, session_id: str, key: str) -> str:
        return self._names(session_id, key)[1]

    def _names(self, session_id: str, key: str) -> tuple[str, str]:
        """The Redis names of a key's entry and of its fill lease (in its session's group)."""
        digest = self._hash(session_id, key)
        prefix = self.group(session_id).prefix
        return f"{prefix}m:{digest}", f"{prefix}lease:{digest}"

    @property
    def clustered(self) -> bool:
        """Whether the alias is a Redis Cluster (:class:`agentmemory.redis_cluster.ClusterClient`)."""
        return isinstance(self.client, _cluster_client_class())

    @property
    def groups(self) -> list[Group]:
        """Every group's names: one group on one Redis, :data:`CLUSTER_GROUPS` on a cluster,
        each under a hash tag of its own (``{<tier>-<n>}``: two tiers sharing a cluster spread
        over different slots)."""
        groups = self._groups
        if groups is None or self._client[1] != _caches_generation[0]:
            prefix = self.prefix
            if self.clustered:
                tier = hashlib.blake2b(prefix.encode(), digest_size=4).hexdigest()
                groups = [Group(f"{prefix}{{{tier}-{n}}}:") for n in range(CLUSTER_GROUPS)]
            else:
                groups = [Group(prefix)]
            self._groups = groups
        return groups

    def group(self, session_id: str) -> Group:
        """The group holding ``session_id``'s names."""
        groups = self.groups
        return groups[0] if len(groups) == 1 else groups[group_index(session_id, len(groups))]

    # The first group's names: on one Redis, the only group's.

    @property
    def fence_key(self) -> str:
        return self.groups[0].fence

    @property
    def epoch_key(self) -> str:
        """The newest database epoch any writer or reader of this tier has seen (no TTL)."""
        return self.groups[0].epoch

    @property
    def lineage_key(self) -> str:
        """The lineage, the third part of every stamp (no TTL): bumped, nothing stored before is
        trusted (a database that went back in time, ``forget_everything``)."""
        return self.groups[0].lineage

    @property
    def incarnation_key(self) -> str:
        """The highest :class:`~agentmemory.models.CacheIncarnation` counter a renewal published
        (no TTL): a database whose counter is lower went back in time."""
        return self.groups[0].incarnation

    @property
    def recent_key(self) -> str:
        """The keys of the entries stored since the last renewal's capture."""
        return self.groups[0].recent

    @property
    def checking_key(self) -> str:
        """The captured keys a renewal checks against the database (what a renewal that failed
        or died left is checked by the next)."""
        return self.groups[0].checking

    def database_epoch(self) -> str:
        """The epoch of the database as this thread's connection to it found it
        (:func:`agentmemory.vendors.epoch`): what this thread's writes and fills are stamped
        with, and what its renewals put in the fence."""
        from django.db import connections

        return epoch(connections[self.using])

    # ------------------------------------------------------------------ plumbing

    @property
    def protected(self) -> bool:
        """``AGENTMEMORY["CACHE_PROTECTION"]``, read at each use: off, the tier skips what keeps
        it from serving a stale version (server identity, tombstones, pending records and the
        fence wait). A declared seam for memcheck's tests; system check E014 when off."""
        return bool(get_config()["CACHE_PROTECTION"])

    @property
    def client(self) -> Any:
        """The redis-py client of this alias (django-redis' connection pool), looked up once
        (redis-py's client is thread-safe; the lookup cost 17 µs of every recall) and again
        after ``CACHES`` changes: for the scripts, memcheck's audit and faults, the test plugin
        and the benchmarks."""
        client, generation = self._client
        if client is None or generation != _caches_generation[0]:
            from django_redis import get_redis_connection

            client = get_redis_connection(self.alias)
            self._client = (client, _caches_generation[0])
        return client

    def _run(self, source: str, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run a Lua script once per (keys, args) in one round trip, by its SHA (redis-py's
        pipelined scripts would add a SCRIPT EXISTS round trip to every call)."""
        client = self.client
        sha = self._scripts.get(source)
        if sha is None:
            sha = self._scripts[source] = client.script_load(source)
        for attempt in range(2):
            try:
                if len(calls) == 1:
                    keys, args = calls[0]
                    replies = [client.evalsha(sha, len(keys), *keys, *args)]
                else:
                    pipe = client.pipeline(transaction=False)
                    for keys, args in calls:
                        pipe.evalsha(sha, len(keys), *keys, *args)
                    replies = pipe.execute()
                self._answered()
                return replies
            except _no_script_error():  # Redis restarted or flushed its scripts: load it again
                if attempt:
                    raise
                sha = self._scripts[source] = client.script_load(source)
        raise AssertionError("unreachable")

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n
        telemetry.cache_event(name, n)

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def up(self, session_id: str) -> bool:
        """Whether to call Redis about ``session_id`` now: not within a moment of a failure of
        Redis -- on a cluster, of the node holding the session's group (a shard down costs its
        own groups only)."""
        if time.monotonic() < self._down_until:
            return False
        if not self._groups_down:
            return True
        return time.monotonic() >= self._groups_down.get(self.group(session_id).prefix, 0.0)

    def _failed(self, exc: BaseException, group: Group | None = None) -> None:
        """Count every error; log once per outage; stop calling Redis for a moment -- on a
        cluster, about ``group`` only, when the failure was about one group."""
        self.count("errors")
        until = time.monotonic() + min(1.0, self.fence_seconds)
        with self._lock:
            first = not self._outage
            self._outage = True
            if group is not None and self.clustered:
                self._groups_down[group.prefix] = until
            else:
                self._down_until = until
        if first:
            logger.warning(
                "Redis cache %r unreachable, serving from the database: %s", self.alias, exc
            )

    def _answered(self) -> None:
        """Redis answered: end the outage, if there was one, with one log line."""
        if self._outage:
            with self._lock:
                ended, self._outage = self._outage, False
            if ended:
                logger.warning("Redis cache %r reachable again", self.alias)

    # ------------------------------------------------------------------ reads

    def read(self, session_id: str, keys: Iterable[str]) -> dict[str, CachedRead]:
        """One round trip: each key's entry and the fence -- a plain ``MGET`` when every key is
        a hit this server stored (:meth:`_read_warm`), else the read script: entries, fence,
        server identity, the Redis clock and a fill lease for each miss. Empty when Redis is
        unreachable (the caller reads the database)."""
        keys = list(keys)
        if not self.up(session_id):
            return {}
        protected = self.protected
        try:
            replies = None
            if len(keys) == 1 or Defect.FRACTURED_READ not in self.defects:
                replies = self._read_warm(session_id, keys, protected)
            if replies is None:
                replies = self._read_by_script(session_id, keys, protected)
        except Exception as exc:  # any Redis failure degrades to the database
            self._failed(exc, self.group(session_id))
            return {}
        return self._judge(session_id, keys, replies)

    def _read_warm(
        self, session_id: str, keys: list[str], protected: bool
    ) -> list[tuple[Any, int, int, None]] | None:
        """The warm read: the fence and every entry in one plain ``MGET``, each entry judged
        here -- a hit only if it is no tombstone and carries the stamp the read script would
        trust: the ``run_id`` of the server process this connection is open to, and the
        fence's epoch. None (the script then reads again) when any key is not such a hit, when
        this connection's server is not known, or when the connection was lost (the script's
        call retries it on a new one).

        Sound because a TCP connection cannot outlive the Redis process it was opened to: the
        ``run_id`` learned on it (:func:`_server_of`, ``INFO server`` on that connection, again
        after every reconnect) is the ``run_id`` of the process that answers the ``MGET``, as
        the script's own ``INFO`` would be. Behind a proxy that keeps client connections across
        server restarts that would not hold: there ``INFO`` is not answered (twemproxy), no
        server is known, and every read takes the script.

        On Redis Cluster the ``MGET`` goes to the primary the client knows for the session's
        group; one that no longer serves the slot (a failover, a migration) answers with a
        redirection, and the script's call, which follows it, reads instead."""
        group = self.group(session_id)
        client = self.client
        clustered = self.clustered
        lost = _connection_errors()
        redirected = _redirected() if clustered else ()
        try:
            if clustered:
                pool = client.get_node_from_key(group.fence).redis_connection.connection_pool
            else:
                pool = client.connection_pool
            connection = pool.get_connection()
        except lost:  # refused: the script's call retries (and, if it fails too, counts it)
            return None
        except Exception:  # the cluster's slots not known yet: the script's call learns them
            if clustered:
                return None
            raise
        try:
            server = _server_of(connection, forget_on_reconnect=self._relearns)
            if not server:
                return None
            connection.send_command(
                "MGET", group.fence, *(self.entry_key(session_id, k) for k in keys)
            )
            fence, *entries = connection.read_response()
            if _server_of(connection, ask=False) != server:  # reconnected meanwhile
                return None
        except lost:
            connection.disconnect()
            return None
        except redirected:  # MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the script's call follows it
            return None
        except BaseException:
            connection.disconnect()  # an answer may be left unread on it
            raise
        finally:
            pool.release(connection)
        self._answered()
        if fence is None:
            return None
        trusted = stamp(server, _text(fence)) if protected else None
        if any(raw is None or entry_version(raw, trusted) is None for raw in entries):
            return None  # a miss, a tombstone, or another server's or epoch's entry
        return [(raw, 1, 0, None) for raw in entries]

    def _read_by_script(
        self, session_id: str, keys: list[str], protected: bool
    ) -> list[tuple[Any, int, int, Any]]:
        """The read script's answer for each key: (entry, fence present, Redis clock ms,
        lease)."""
        flag = "1" if protected else "0"
        fence = self.group(session_id).fence
        # Bounded: one call fills at most FILLS_PER_CALL keys (a recall_many of thousands of
        # missing keys must not cache thousands of absences).
        may_lease = ["1" if at < FILLS_PER_CALL else "0" for at in range(len(keys))]
        tokens = [self._token() for _ in keys]
        if len(keys) > 1 and Defect.FRACTURED_READ not in self.defects:
            names = [name for key in keys for name in self._names(session_id, key)]
            args = [x for pair in zip(tokens, may_lease, strict=True) for x in pair]
            ((fence_present, redis_ms, *each),) = self._run(
                READ_MANY_SCRIPT, [([fence, *names], [self.lease_ms, flag, *args])]
            )
            return [
                (each[2 * at], fence_present, redis_ms, each[2 * at + 1]) for at in range(len(keys))
            ]
        # One key (or the defect: each key by its own script, at its own instant).
        calls = []
        for key, token, lease_flag in zip(keys, tokens, may_lease, strict=True):
            entry, lease = self._names(session_id, key)
            calls.append(([entry, fence, lease], [token, self.lease_ms, lease_flag + flag]))
        if len(calls) == 1:
            return self._run(READ_SCRIPT, calls)
        replies = []
        for call in calls:  # the defect: a round trip per key, a moment apart
            replies += self._run(READ_SCRIPT, [call])
            time.sleep(FRACTURED_GAP_SECONDS)
        return replies

    @property
    def _relearns(self) -> bool:
        return Defect.SERVER_ID_KEPT not in self.defects

    def _judge(
        self, session_id: str, keys: list[str], replies: list[tuple[Any, int, int, Any]]
    ) -> dict[str, CachedRead]:
        """What each key's reply means: a hit (decoded, its expiry checked), a miss (with the
        lease it took, if any), or nothing to trust (no fence)."""
        now = clock.now()
        found = {}
        for index, (key, (raw, fence, redis_ms, lease)) in enumerate(
            zip(keys, replies, strict=True)
        ):
            trusted = fence == 1
            if not trusted:
                found[key] = CachedRead(False, redis_ms=redis_ms)
                continue
            if not raw:
                self.count("misses")
                found[key] = CachedRead(
                    True,
                    lease=_text(lease) if lease else None,
                    redis_ms=redis_ms,
                    contended=not lease and index < FILLS_PER_CALL,
                )
                continue
            record = self._decode(session_id, key, raw)
            if record is _FOREIGN:  # a hash collision: never hand out another key's value
                found[key] = CachedRead(True, redis_ms=redis_ms)
                continue
            expiry_checked = (
                not {
                    Defect.EXPIRED_FROM_CACHE,
                    Defect.HIT_EXPIRY_UNCHECKED,
                }
                & self.defects
            )
            if (
                record is not None
                and expiry_checked
                and not is_live(MemoryState.LIVE, record.expires_at, now)
            ):
                record = None  # the newest version has expired: the memory is absent
            self.count("hits")
            found[key] = CachedRead(True, record=record, hit=True, redis_ms=redis_ms)
        return found

    def read_through(
        self,
        session_id: str,
        keys: list[str],
        load: Callable[[str, list[str]], list[tuple[str, int, MemoryRecord | None]]],
        reads: dict[str, CachedRead] | None = None,
    ) -> tuple[dict[str, MemoryRecord], str]:
        """The live records of ``keys``: Redis first; ``load(session_id, missing)`` -- the
        database's (key, version, live record or None) -- for misses, filling Redis under the
        reader's lease, and for everything while Redis is untrusted or unreachable. Returns the
        records and where they came from (``"cache"`` when every key was a hit). ``reads``: what
        :meth:`read` already answered for these keys (its leases are used for the fills)."""
        if reads is None:
            reads = self.read(session_id, keys)
        fractured = Defect.FRACTURED_READ in self.defects
        # Another reader holds the fill lease of a hot key: wait (briefly, backing off) for its
        # fill rather than sending every concurrent miss to the database. One key only: keys
        # read again later would be read at another instant than the rest.
        deadline, pause = time.monotonic() + HOT_KEY_WAIT_SECONDS, 0.002
        while (len(keys) == 1 or fractured) and (
            busy := [k for k, r in reads.items() if r.contended]
        ):
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.025)
            reads.update(self.read(session_id, busy))
        found = {k: r.record for k, r in reads.items() if r.hit and r.record is not None}
        missing = [k for k in keys if k not in reads or not reads[k].hit]
        if not missing:
            return found, "cache"
        if fractured:
            time.sleep(FRACTURED_GAP_SECONDS)  # the misses read a moment after the hits
        else:
            # Read-atomic: one miss and every key is read from the database, in one statement
            # (one snapshot). Hits of Redis with misses read later would mix two instants: a
            # remember_many committed in between would be seen on one key and not the other.
            missing, found = list(keys), {}
        failpoint_before_load(session_id, missing)
        slow_fills = []
        for key, version, record in load(session_id, missing):
            if record is not None:
                found[key] = record
            lease = reads[key].lease if key in reads else None
            if Defect.FILL_WITHOUT_LEASE in self.defects and key in reads:
                slow_fills.append((key, record, version))
            elif lease:
                self.fill(session_id, key, record, version, lease)
        if slow_fills:
            time.sleep(SLOW_FILL_SECONDS)
            for key, record, version in slow_fills:
                failpoint_before_fill(session_id, key, version)
                self._put(session_id, key, record, version, "", force=True)
        untrusted = next((r for r in reads.values() if not r.trusted), None)
        if untrusted is not None:
            self.renew_fence(untrusted.redis_ms, self.group(session_id))
        return found, "database"

    def fill(
        self, session_id: str, key: str, record: MemoryRecord | None, version: int, lease: str
    ) -> None:
        """Store what a reader found in the database, if its lease still holds."""
        failpoint_before_fill(session_id, key, version)
        self._put(session_id, key, record, version, lease)

    # ------------------------------------------------------------------ writes

    def writing(self, session_id: str, versions: dict[str, int]) -> bool:
        """Before a write commits, under its row locks: each key's entry becomes a tombstone of
        the version about to commit, so that a writer that dies between its commit and
        :meth:`written` leaves readers a miss, never an older version. False if Redis could not
        be reached: the caller records the keys as pending in its transaction instead."""
        if not self.protected:
            return True
        if not versions or not self.up(session_id):
            return False
        keys = sorted(versions)
        epoch_now = self.database_epoch()
        group = self.group(session_id)
        try:
            failpoint_tombstones(session_id, versions)
            self._run(
                MARK_SCRIPT,
                [
                    (
                        [
                            group.fence,
                            group.epoch,
                            group.lineage,
                            *(self.entry_key(session_id, key) for key in keys),
                        ],
                        [TOMBSTONE_MS, epoch_now, *(versions[key] for key in keys)],
                    )
                ],
            )
        except Exception as exc:
            self._failed(exc, group)
            return False
        return True

    def written(
        self, session_id: str, changes: dict[str, tuple[MemoryRecord | None, int] | None]
    ) -> None:
        """After a commit: store each key's new version. A change of None means the version is
        not known here (an earlier attempt committed it and its acknowledgement was lost): the
        entry is dropped, so the next reader misses. If Redis cannot take them, record the keys
        in the database and wait out the fence before the write is acknowledged.

        A COMMIT the database could not confirm (PostgreSQL's cancelled wait for the synchronous
        standby: the write raises ``MemoryUnavailable``) is cached as unknown: dropped."""
        from django.db import connections

        if commit_unconfirmed(connections[self.using]):
            changes = dict.fromkeys(changes)
        failed = [
            key
            for key, change in sorted(changes.items())
            if change is not None and not self._put(session_id, key, *change, "")
        ]
        unknown = sorted(key for key, change in changes.items() if change is None)
        if unknown and not (self.up(session_id) and self._drop([(session_id, k) for k in unknown])):
            failed += unknown
        if failed and self.protected:
            self._record_pending(session_id, sorted(failed))

    def erased(self, session_id: str, keys: Iterable[str]) -> None:
        keys = sorted(keys)
        if not keys:
            return
        if not (self.up(session_id) and self._drop([(session_id, key) for key in keys])):
            self._record_pending(session_id, keys)

    def forget_everything(self) -> int:
        """Distrust everything this tier holds of its database, at once (the lineage bumped, the
        fence dropped: from that instant no entry stored before is a hit, and no fill read
        before is stored), then delete its entries and fill leases to free their memory: after
        ``manage.py flush``, or anything else that changed the database behind the store. Always
        safe: it can only cause misses. Returns how many names were deleted; raises the client's
        error if Redis cannot be reached."""
        client = self.client
        groups = self.groups
        for group in groups:
            self._run(FORGET_SCRIPT, [([group.fence, group.lineage], [])])
        deleted = len(groups)
        kept = {
            name.encode()
            for group in groups
            for name in (group.epoch, group.lineage, group.incarnation, group.fence)
        }
        batch: list[Any] = []
        for name in client.scan_iter(match=f"{self.prefix}*", count=1000):
            if (name if isinstance(name, bytes) else name.encode()) in kept:
                # the newest epoch seen (older fences stay refused), the lineage and the
                # incarnation (they only move forward), a fence renewed since
                continue
            batch.append(name)
            if len(batch) >= 1000:
                deleted += client.delete(*batch)
                batch = []
        if batch:
            deleted += client.delete(*batch)
        return deleted

    def _drop(self, keys: list[tuple[str, str]], group: Group | None = None) -> bool:
        """Delete the entries and fill leases of these (session_id, key) pairs: always safe, it
        can only cause misses. False if Redis could not be reached. ``group``: all of them are
        of that group (a failure stops calls about that group only, on a cluster)."""
        if group is None and len({session_id for session_id, _ in keys}) == 1:
            group = self.group(keys[0][0])
        try:
            self.client.delete(*[name for pair in keys for name in self._names(*pair)])
        except Exception as exc:
            self._failed(exc, group)
            return False
        self._answered()
        return True

    def _put(
        self,
        session_id: str,
        key: str,
        record: MemoryRecord | None,
        version: int,
        lease: str,
        *,
        force: bool = False,
    ) -> bool:
        """True if Redis answered (stored or rightly rejected); False if it could not be reached.
        ``force``: the FILL_WITHOUT_LEASE defect's plain SET, no lease and no version check."""
        if not self.up(session_id):
            return False
        ttl_ms = self.max_entry_ms
        if Defect.EXPIRED_FROM_CACHE in self.defects:
            pass  # the entry lives its full time, expired or not
        elif record is not None and record.expires_at is not None:
            ttl_ms = min(ttl_ms, int((record.expires_at - clock.now()).total_seconds() * 1000))
            if ttl_ms <= 0:
                record, ttl_ms = None, self.max_entry_ms  # already expired: cache it as absent
        epoch_now = self.database_epoch()
        group = self.group(session_id)
        try:
            keys = [
                *self._names(session_id, key),
                group.fence,
                group.epoch,
                group.lineage,
                group.recent,
            ]
            member = json.dumps([session_id, key]) if self.protected else ""
            args = [
                version,
                self._encode(session_id, key, record),
                ttl_ms,
                lease,
                epoch_now,
                member,
                RECENT_BOUND,
            ]
            stored = self._run(self._put_source(force, lease), [(keys, args)])[0]
        except Exception as exc:
            self._failed(exc, group)
            return False
        self.count(("fills" if lease else "updates") if stored else "stale_rejected")
        return True

    def _put_source(self, force: bool, lease: str) -> str:
        if force:
            return SET_SCRIPT
        if lease and Defect.FILL_IGNORES_VERSION in self.defects:
            return FILL_IGNORES_VERSION_SCRIPT
        if Defect.FILL_IGNORES_LEASE in self.defects:
            return FILL_IGNORES_LEASE_SCRIPT
        return PUT_SCRIPT

    # ------------------------------------------------------------------ outages

    def _record_pending(self, session_id: str, keys: list[str]) -> None:
        try:
            PendingInvalidation.record(self.using, session_id, keys)
            oldest = (
                PendingInvalidation.objects.using(self.using)
                .order_by("id")
                .values_list("created_at", flat=True)
                .first()
            )
        except DatabaseError as exc:
            raise MemoryUnavailable(
                "the write committed, but neither Redis nor the database could record that the "
                "cache is behind; retry with the same idempotency_key",
                cause=exc,
            ) from exc
        self.count("pending_recorded", len(keys))
        # No fence renewed after the oldest pending record can exist (renewals check first), so
        # once one fence period (plus a margin for clock rates) has passed since then, no reader
        # trusts Redis any more.
        margin = 0.05 + self.fence_seconds * 0.05
        wait = (
            (oldest or timezone.now())
            + timedelta(seconds=self.fence_seconds + margin)
            - timezone.now()
        ).total_seconds()
        if wait > 0:
            self.count("fence_waits")
            time.sleep(wait)

    def renew_fence(self, redis_ms: int, group: Group | None = None) -> None:
        """Called by a reader that found no fence: replay what is pending, then renew the fence
        with an expiry counted from ``redis_ms``, the Redis clock read before the pending check.
        ``group``: the reader's (on Redis Cluster each group has its fence; what is pending is
        replayed whatever its group, since a writer's wait counts on no fence being renewed
        before it is). Default: the first group.

        Replaying a key deletes its entry and lease (never sets a value): whatever Redis holds
        for it may be older than the database, and deleting can only cause a miss."""
        group = group or self.groups[0]
        if time.monotonic() < max(self._down_until, self._renew_after):
            return
        if self._groups_down and time.monotonic() < self._groups_down.get(group.prefix, 0.0):
            return
        pending = list(
            PendingInvalidation.objects.using(self.using)
            .order_by("id")
            .values_list("id", "session_id", "key")[:PENDING_BATCH]
        )
        if pending and Defect.RENEWAL_IGNORES_PENDING not in self.defects:
            # Each group's pending keys are replayed on their own (on a cluster, a shard down
            # keeps its own pending, not the others'). Only this group's keep its fence down: a
            # writer waits for its own group's fence (the batch is read whole, or every pending
            # key counts).
            by_group: dict[str, list[tuple[int, str, str]]] = {}
            for row in pending:
                by_group.setdefault(self.group(row[1]).prefix, []).append(row)
            replayed: list[int] = []
            for rows in by_group.values():
                mine = self.group(rows[0][1])
                if self.up(rows[0][1]) and self._drop([(s, k) for _, s, k in rows], mine):
                    replayed += [pending_id for pending_id, _, _ in rows]
            if replayed:
                PendingInvalidation.objects.using(self.using).filter(id__in=replayed).delete()
                self.count("replayed", len(replayed))
            if group.prefix in by_group or len(pending) >= PENDING_BATCH:
                return  # renew on a later read, after a fresh pending check
        epoch_now = self.database_epoch()
        went_back, counter, checked = False, "", []
        try:
            if self.protected and Defect.RESTORE_UNSEEN not in self.defects:
                try:
                    went_back, published, checked = self._check_incarnation(epoch_now, group)
                except DatabaseError as exc:
                    # A conflict on the counter's row (another renewal, on another Galera node),
                    # a lost connection: no renewal now; this process tries again after a moment.
                    self.count("renewal_errors")
                    self._renew_after = time.monotonic() + min(
                        RENEWAL_BACKOFF_SECONDS, self.fence_seconds
                    )
                    logger.debug("fence renewal skipped: %s", exc)
                    return
                counter = str(published)
            failpoint_before_renewal()
            if Defect.FENCE_FROM_RENEWAL in self.defects:
                seconds, micros = self._time(group)
                redis_ms = seconds * 1000 + micros // 1000
            expiry = redis_ms + int(self.fence_seconds * 1000)
            self._run(
                RENEW_SCRIPT,
                [
                    (
                        [group.fence, group.epoch, group.lineage, group.incarnation],
                        [epoch_now, expiry, "1" if went_back else "0", counter],
                    )
                ],
            )
            for at in range(0, len(checked), CHECK_CHUNK):
                self.client.srem(group.checking, *checked[at : at + CHECK_CHUNK])
        except Exception as exc:
            self._failed(exc, group)
            return
        self._answered()
        self.count("fence_renewals")

    def _time(self, group: Group) -> tuple[int, int]:
        """The Redis clock of the server holding ``group`` (seconds, microseconds)."""
        if self.clustered:
            return self.client.time(target_nodes=self.client.get_node_from_key(group.fence))
        return self.client.time()

    def _check_incarnation(self, epoch_now: str, group: Group) -> tuple[bool, int, list[Any]]:
        """The check a renewal makes before it renews: did the database go back in time?

        Two ways of seeing it, each cheap: the database's :class:`CacheIncarnation` counter is
        behind the one Redis holds (the database is older than the last renewal that checked
        entries: a dump restored, a point-in-time recovery, a promoted replica, a volume
        snapshot); or an entry stored since the last renewal holds a version the database does
        not (it went back to before the entry was stored, after that renewal). When entries were
        stored, the counter moves forward, in the same transaction as their check -- so a
        database taken back to before this check has a counter Redis knows to be old.

        Returns (whether it went back, the counter to publish, the members checked). Raises
        ``DatabaseError`` (no renewal now) and the client's errors."""
        from django.db import connections, transaction

        captured = self._run(
            CAPTURE_SCRIPT,
            [([group.recent, group.checking, group.lineage, group.incarnation], [])],
        )[0]
        members, lineage, known, run_id = captured
        known = int(known)
        trusted = stamp(_text(run_id), f"{epoch_now}#{_text(lineage)}")
        pairs = sorted({tuple(json.loads(_text(m))) for m in members})
        entries = self._trusted_entries(pairs, trusted)
        connection = connections[self.using]
        with transaction.atomic(using=self.using):
            if connection.vendor == "postgresql":
                # A recall runs this: its COMMIT must not wait for a synchronous standby, which
                # with Patroni's synchronous_mode_strict and the standby gone is forever. Flushed
                # on the primary only, a failover can take the counter back below what Redis
                # holds: the next renewal then sees the database gone back (it did: a commit
                # was lost) and the cache distrusts all it held -- as the failover's new
                # timeline already made it.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit = local")
            counter = _incarnation(connection, move=bool(pairs))
            before = counter - 1 if pairs else counter
            unbacked = _unbacked(self.using, entries)
            if unbacked:  # read again: an erasure's drop may have been on its way
                again = self._trusted_entries(sorted(unbacked), trusted)
                unbacked = {p: why for p, why in unbacked.items() if again.get(p) == entries[p]}
            went_back = before < known or bool(unbacked)
            if went_back:
                counter = _incarnation(connection, move=True, at_least=max(counter, known) + 1)
        if went_back:
            self.count("went_back")
            reason = (
                f"its incarnation counter is {before}, Redis holds {known}"
                if before < known
                else "; ".join(
                    f"{s!r}/{k!r}: {why}" for (s, k), why in sorted(unbacked.items())[:5]
                )
            )
            logger.warning(
                "database %r went back in time (%s): the Redis cache %r distrusts everything it "
                "held of it",
                self.using,
                reason,
                self.alias,
            )
        return went_back, counter, list(members)

    def _trusted_entries(
        self, pairs: list[tuple[str, str]], trusted: str
    ) -> dict[tuple[str, str], tuple[int, dict[str, Any]]]:
        """The entries of ``pairs`` a reader would trust under stamp ``trusted`` (no tombstone):
        (version, payload), read in rounds of :data:`CHECK_CHUNK`."""
        found = {}
        for at in range(0, len(pairs), CHECK_CHUNK):
            chunk = pairs[at : at + CHECK_CHUNK]
            raws = self.client.mget([self.entry_key(s, k) for s, k in chunk])
            for pair, raw in zip(chunk, raws, strict=True):
                if raw is None:
                    continue
                version, server, data = decode_entry(raw)
                if data is not None and server == trusted and (data["s"], data["k"]) == pair:
                    found[pair] = (version, data)
        return found

    def trusted_stamp(self, group: Group | None = None) -> str:
        """The stamp of the entries a reader trusts now in ``group`` (default: the first): the
        ``run_id`` of the Redis server holding it, the fence's epoch and lineage (when no fence
        is up: the database's epoch and the current lineage, what the next renewal sets)."""
        client = self.client
        group = group or self.groups[0]
        fenced = client.get(group.fence)
        if fenced is None:
            lineage = _text(client.get(group.lineage) or b"0")
            fenced = f"{self.database_epoch()}#{lineage}"
        if self.clustered:
            info = client.info("server", target_nodes=client.get_node_from_key(group.fence))
        else:
            info = client.info("server")
        return stamp(info["run_id"], _text(fenced))

    def repair(
        self, *, dry_run: bool = False, progress: Callable[[int, int], None] | None = None
    ) -> tuple[int, list[tuple[tuple[str, str], str]]]:
        """Compare every entry this tier would serve of its database with the database, and
        delete each one the database does not back: a version it does not hold, the version it
        holds with another value, a row gone, an older version -- what raw SQL, a restore or a
        promoted replica leave behind. Returns how many entries were compared, and each one
        deleted (``dry_run``: that would be) with why. ``progress(done, 0)`` after each batch.

        Safe under traffic: an entry is deleted only if it is still the one compared (a write
        that replaced it meanwhile keeps its own), a deletion only causes misses, and the key's
        fill lease goes with it (a fill read before cannot store the old row back). Entries no
        reader trusts (another Redis process's, epoch's or lineage's) are never served and are
        left to their TTL. Raises the client's errors and ``DatabaseError``."""
        client = self.client
        compared, fixed = 0, []

        def check(names: list[Any], trusted: str) -> None:
            nonlocal compared
            entries, raws = {}, {}
            for raw in client.mget(names):
                if raw is None:
                    continue
                version, server, data = decode_entry(raw)
                if data is None or server != trusted:
                    continue
                pair = (data["s"], data["k"])
                entries[pair], raws[pair] = (version, data), raw
            compared += len(entries)
            for pair, why in sorted(_unbacked(self.using, entries, older=True).items()):
                if (
                    dry_run
                    or self._run(DROP_IF_SAME_SCRIPT, [(self._names(*pair), [raws[pair]])])[0]
                ):
                    fixed.append((pair, why))
            if progress is not None:
                progress(compared, 0)

        for group in self.groups:  # a group's entries are in one slot: one MGET per chunk
            trusted = self.trusted_stamp(group)
            names: list[Any] = []
            for name in client.scan_iter(match=f"{group.prefix}m:*", count=1000):
                names.append(name)
                if len(names) >= CHECK_CHUNK:
                    check(names, trusted)
                    names = []
            if names:
                check(names, trusted)
        return compared, fixed

    # ------------------------------------------------------------------ encoding

    def _encode(self, session_id: str, key: str, record: MemoryRecord | None) -> str:
        return encode_payload(session_id, key, record)

    def _decode(self, session_id: str, key: str, raw: bytes) -> Any:
        version, _server, data = decode_entry(raw)
        if data is None or (data["s"], data["k"]) != (session_id, key):
            return _FOREIGN
        if data.get("absent"):
            return None
        return MemoryRecord(
            session_id,
            key,
            data["v"],
            version,
            datetime.fromisoformat(data["c"]),
            datetime.fromisoformat(data["u"]),
            datetime.fromisoformat(data["e"]) if data["e"] else None,
        )


def _incarnation(connection: Any, *, move: bool, at_least: int | None = None) -> int:
    """The database's :class:`CacheIncarnation` counter (0 when its row is missing: a database
    restored from before it existed, or flushed). ``move``: moved forward by one first, or to
    ``at_least``, the row created if missing -- an ``UPDATE`` first, which takes the row's lock
    (and SQLite's write lock) before anything is read."""
    from .models import CacheIncarnation

    rows = CacheIncarnation.objects.using(connection.alias).filter(pk=CacheIncarnation.ONLY)
    if move:
        counter = (
            F("counter") + 1 if at_least is None else Greatest(F("counter") + 1, Value(at_least))
        )
        if not rows.update(counter=counter, moved_at=timezone.now()):
            insert_if_missing(
                connection,
                CacheIncarnation,
                {"id": CacheIncarnation.ONLY, "counter": 0, "moved_at": timezone.now()},
            )
            rows.update(counter=counter, moved_at=timezone.now())
    return rows.values_list("counter", flat=True).first() or 0


def _unbacked(
    using: str,
    entries: dict[tuple[str, str], tuple[int, dict[str, Any]]],
    *,
    older: bool = False,
) -> dict[tuple[str, str], str]:
    """The entries the database does not back -- a version it does not hold, or the version it
    holds with another value or liveness -- each with why. An entry older than the database is
    backed unless ``older`` (a renewal leaves it to the write's own update, which replaces it;
    a repair drops it)."""
    from django.db.models import Q

    from .models import Memory

    pairs = sorted(entries)
    rows: dict[tuple[str, str], tuple[int, str, Any, Any]] = {}
    for at in range(0, len(pairs), CHECK_CHUNK):
        by_session: dict[str, list[str]] = {}
        for session_id, key in pairs[at : at + CHECK_CHUNK]:
            by_session.setdefault(session_id, []).append(key)
        where = Q()
        for session_id, keys in by_session.items():
            where |= Q(session_id=session_id, key__in=keys)
        for session_id, key, *row in (
            Memory._base_manager.using(using)
            .filter(where)
            .values_list("session_id", "key", "version", "state", "value", "expires_at")
        ):
            rows[(session_id, key)] = tuple(row)
    now = clock.now()
    found = {}
    for pair, (version, data) in entries.items():
        why = _why_unbacked(version, data, rows.get(pair), now, older=older)
        if why:
            found[pair] = why
    return found


def _why_unbacked(
    version: int,
    data: dict[str, Any],
    row: tuple[int, str, Any, Any] | None,
    now: datetime,
    *,
    older: bool = False,
) -> str | None:
    """Why the database does not back an entry of ``version`` and payload ``data``, given the
    key's row (version, state, value, expires_at) or None: None if it does."""
    from .validation import same_json

    held = 0 if row is None else row[0]
    if version > held:
        return f"Redis serves version {version}, the database holds version {held}"
    if version < held:
        return (
            f"Redis serves version {version}, the database holds version {held}" if older else None
        )
    if row is None:
        return None
    _, state, value, expires_at = row
    if data.get("absent"):
        if is_live(state, expires_at, now) and expires_at is None:
            return f"Redis serves version {version} as absent, the database holds it live"
        return None
    if state != MemoryState.LIVE or not same_json(data["v"], value):
        return f"Redis serves version {version} with another value than the database's"
    return None


# ---------------------------------------------------------------------- the entry format
# "<version>|<run_id>|<payload>" (see the scripts above).


def encode_payload(session_id: str, key: str, record: MemoryRecord | None) -> str:
    """The JSON half of an entry (the put script prefixes the version)."""
    if record is None:
        return json.dumps({"s": session_id, "k": key, "absent": True})
    return json.dumps(
        {
            "s": session_id,
            "k": key,
            "v": record.value,
            "c": record.created_at.isoformat(),
            "u": record.updated_at.isoformat(),
            "e": record.expires_at.isoformat() if record.expires_at else None,
        },
        ensure_ascii=False,
    )


def decode_entry(raw: bytes | str) -> tuple[int, str, dict[str, Any] | None]:
    """An entry as (version, its stamp -- ``<run_id>/<epoch>``: the server that stored it and the
    database epoch -- and the payload dict or None for a tombstone)."""
    version, _, rest = _text(raw).partition("|")
    server, _, payload = rest.partition("|")
    return int(version), server, None if payload == "~" else json.loads(payload)


def entry_version(raw: bytes | str, stamp: str | None = None) -> int | None:
    """The version an entry serves, without decoding its payload; None for a tombstone or, given
    the ``stamp`` a reader trusts now (:func:`stamp`), an entry another server stored or of
    another database epoch (neither is ever served)."""
    version, _, rest = _text(raw).partition("|")
    server, _, payload = rest.partition("|")
    if payload == "~" or (stamp is not None and server != stamp):
        return None
    return int(version)


def stamp(run_id: str, database_epoch: str) -> str:
    """The stamp of an entry that a reader trusts: the current Redis server's ``run_id`` and
    the epoch of the fence (the database's, once a reader of it renews the fence)."""
    return f"{run_id}/{database_epoch}"


@functools.lru_cache(maxsize=4096)
def _digest(session_id: str, key: str) -> str:
    """The hash naming a key's entry and lease in Redis (fixed length, whatever the ids)."""
    return hashlib.sha256(f"{session_id}\x00{key}".encode()).hexdigest()[:40]


class _Server:
    """The Redis server process one connection is open to: its ``run_id``, learned on that
    connection and forgotten when it reconnects (redis-py calls :meth:`reconnected` on every
    new socket)."""

    __slots__ = ("__weakref__", "run_id")

    def __init__(self) -> None:
        self.run_id: str | None = None

    def reconnected(self, _connection: Any) -> None:
        self.run_id = None


#: Where a redis-py connection keeps its :class:`_Server` (an attribute of ours on it).
_SERVER = "_agentmemory_server"
_RUN_ID = re.compile(rb"^run_id:([0-9a-f]+)", re.MULTILINE)


def _server_of(
    connection: Any, *, forget_on_reconnect: bool = True, ask: bool = True
) -> str | None:
    """The ``run_id`` of the server process ``connection`` is open to, asked on it (``INFO
    server``) the first time and after every reconnect; ``""`` when the server does not say
    (a proxy); None when not known and not ``ask``-ed. ``forget_on_reconnect=False`` is the
    ``SERVER_ID_KEPT`` defect: the first answer is kept whatever the connection reconnects to."""
    server = getattr(connection, _SERVER, None)
    if server is None:
        server = _Server()
        setattr(connection, _SERVER, server)
        if forget_on_reconnect:
            connection.register_connect_callback(server.reconnected)
    if server.run_id is None and ask:
        connection.send_command("INFO", "server")
        found = _RUN_ID.search(connection.read_response() or b"")
        server.run_id = found.group(1).decode() if found else ""
    return server.run_id


def is_cluster_alias(alias: str) -> bool:
    """Whether cache ``alias`` is configured with
    :class:`~agentmemory.redis_cluster.ClusterClient` (read from the settings: no connection
    made, and nothing of django-redis imported -- ``make memcheck`` installs the core only)."""
    from django.conf import settings

    options = (settings.CACHES.get(alias) or {}).get("OPTIONS") or {}
    client_class = options.get("CLIENT_CLASS", "")
    return isinstance(client_class, str) and client_class.endswith(".ClusterClient")


@functools.cache
def _cluster_client_class() -> type:
    """redis-py's cluster client (redis-py is an optional dependency: imported on first use)."""
    from redis.cluster import RedisCluster

    return RedisCluster


@functools.cache
def _redirected() -> tuple[type[Exception], ...]:
    """A cluster node's answer that the slot is served elsewhere or not now (``MOVED``,
    ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``): redis-py parses them as these errors."""
    from redis.exceptions import ResponseError

    return (ResponseError,)


@functools.cache
def _connection_errors() -> tuple[type[Exception], ...]:
    """redis-py's lost connection (refused, reset: worth one more try on a new one)."""
    from redis.exceptions import ConnectionError as Lost  # redis-py is an optional dependency

    return (Lost,)


def invalidate_on_commit(using: str, pairs: Iterable[tuple[str, str]]) -> None:
    """The ORM's own writes of memories (:class:`~agentmemory.models.MemoryQuerySet`,
    ``Memory.save``/``delete``): once the transaction on ``using`` commits, the configured tier
    (``AGENTMEMORY["CACHE"]``) drops its entries and fill leases of these ``(session_id, key)``
    pairs -- or, if Redis cannot be reached, records them as pending and waits out the fence,
    as the store's own ``erase_session`` does. Dropping can only cause misses. Nothing without
    a tier."""
    from django.db import transaction

    from .defects import failpoint_orm_write

    alias = get_config()["CACHE"]
    if failpoint_orm_write():  # memcheck's self-test variant orm-write-unseen
        return
    by_session: dict[str, set[str]] = {}
    for session_id, key in pairs:
        by_session.setdefault(session_id, set()).add(key)
    if alias is None or not by_session:
        return
    cache = MemoryCache(alias, using)

    def drop() -> None:
        for session_id, keys in sorted(by_session.items()):
            cache.erased(session_id, keys)

    transaction.on_commit(drop, using=using)


def forget_flushed_database(using: str) -> None:
    """After ``manage.py flush`` (and every ``migrate``, and each transactional test's
    teardown: Django sends ``post_migrate`` after them): the configured tier forgets everything
    it holds of database ``using``. If Redis cannot be reached the error is logged: what it holds
    stays until its entries expire or the tier is cleared by hand (docs/redis.md)."""
    alias = get_config()["CACHE"]
    if alias is None:
        return
    try:
        MemoryCache(alias, using).forget_everything()
    except Exception as exc:  # a flush or a migration must not fail for the cache
        logger.error(
            "Redis cache %r: could not drop the entries of database %r after it was flushed or "
            "migrated (%s); clear the tier's keys by hand (docs/redis.md)",
            alias,
            using,
            exc,
        )


@dataclass(frozen=True)
class CacheProblem:
    """Why the tier's Redis did not answer a PING: ``misconfigured`` (it answered with an
    error: a database index out of range, a refused password -- no retry can help) or
    ``unreachable`` (refused, timed out: maybe only for now)."""

    kind: str
    location: str
    reason: str

    def __str__(self) -> str:
        return f"the Redis of the cache tier ({self.location}) is {self.kind}: {self.reason}"


def probe_cache(alias: str, timeout: float = 2.0) -> CacheProblem | None:
    """PING the Redis behind cache ``alias`` through django-redis (its URL, Sentinels and
    options, as the tier connects), waiting ``timeout`` seconds at most; None if it answered."""
    from django.conf import settings
    from django_redis import get_redis_connection
    from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError

    outcome: dict[str, Any] = {}

    def ping() -> None:
        try:
            client = get_redis_connection(alias)
            client.ping()
            if not isinstance(client, _cluster_client_class()) and client.info("cluster").get(
                "cluster_enabled"
            ):
                raise ImproperlyConfigured(
                    "it is a node of a Redis Cluster: every key of another node's slots would "
                    "be refused (MOVED); set OPTIONS['CLIENT_CLASS'] to "
                    "'agentmemory.redis_cluster.ClusterClient' and LOCATION to "
                    "'redis-cluster://HOST:PORT'"
                )
            outcome["ok"] = True
        except Exception as exc:  # every failure is reported, none raised
            outcome["error"] = exc

    probe = threading.Thread(target=ping, name=f"agentmemory-probe-{alias}", daemon=True)
    probe.start()
    probe.join(timeout)
    if "ok" in outcome:
        return None
    location = str(settings.CACHES.get(alias, {}).get("LOCATION", ""))
    location = re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", location)  # no password shown
    error = outcome.get("error")
    if error is None:
        return CacheProblem("unreachable", location, f"no answer within {timeout:g} s")
    kind = (
        "misconfigured"
        if isinstance(
            error,
            ResponseError | AuthenticationError | AuthorizationError | ImproperlyConfigured,
        )
        else "unreachable"
    )
    return CacheProblem(kind, location, f"{type(error).__name__}: {error}")


@functools.cache
def _no_script_error() -> type[Exception]:
    from redis.exceptions import NoScriptError  # redis-py is an optional dependency

    return NoScriptError


_FOREIGN: Any = object()
#: Bumped whenever the CACHES setting changes (override_settings): cached clients are looked up
#: again.
_caches_generation = [0]


@receiver(setting_changed)
def _caches_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "CACHES":
        _caches_generation[0] += 1


_TOKEN_PREFIX = secrets.token_hex(6)
_TOKENS = itertools.count()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
