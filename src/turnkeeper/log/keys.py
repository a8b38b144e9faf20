"""Every Redis key name of the run log, and the Lua scripts that touch them.

A run owns two keys, both carrying the same hash tag so one script can touch
them on Redis Cluster:

- ``<namespace>:log:{<tag>}``: the stream. Chunk ``seq`` is entry ``0-<seq>``
  with one field ``c`` (the encoded chunk). Closing the log appends one
  terminal marker entry ``0-<next seq>`` with field ``end`` (the closing
  epoch): XADD wakes every parked XREAD, and because the marker is added by the
  same script after every chunk, a reader sees all chunks before it. No chunk
  ever takes the marker's id, since a closed log accepts no appends.
- ``<namespace>:log:{<tag>}:meta``: a hash with ``epoch`` (the fence),
  ``next`` (the next seq), ``closed`` (the closing epoch, absent while open)
  and ``run_id`` (for operators).

The tag is the run id itself when it is short and made of ``[A-Za-z0-9_.:-]``;
any other run id (braces, spaces, non-ASCII, long) is tagged ``~`` plus the
hex SHA-256 of its UTF-8 bytes. ``~`` is outside the plain alphabet, so the two
forms never collide and the mapping stays injective.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from turnkeeper.errors import ConfigError

CHUNK_FIELD: Final = b"c"
END_FIELD: Final = b"end"

_PLAIN_TAG = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def run_tag(run_id: str) -> str:
    """The hash tag of a run: safe inside ``{...}`` and injective."""
    if _PLAIN_TAG.fullmatch(run_id):
        return run_id
    return "~" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()


def fleet_counters_key(namespace: str) -> str:
    """A hash of counters the workers keep (lease renewals, refused appends) for /metrics."""
    return f"{namespace}:fleet:counters"


def check_namespace(namespace: str) -> str:
    """A namespace with braces would move the hash tag: refuse it up front."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(
            f"a log namespace must match [A-Za-z0-9_.:-]{{1,128}}, got {namespace!r}",
            reason="invalid-namespace",
        )
    return namespace


@dataclass(frozen=True, slots=True)
class RunKeys:
    """The keys of one run's log, in the order the scripts take them."""

    stream: str
    meta: str

    @classmethod
    def of(cls, namespace: str, run_id: str) -> RunKeys:
        base = f"{namespace}:log:{{{run_tag(run_id)}}}"
        return cls(stream=base, meta=f"{base}:meta")

    def as_list(self) -> list[str]:
        return [self.stream, self.meta]


# Every script takes KEYS = [stream, meta] and answers an integer on success
# (the epoch or the last seq), or {reason, number} for a refusal, where number
# is the seq or epoch that explains it. Refusals are values, not Lua errors, so
# the caller can raise a typed error with structured fields. A bare integer
# keeps the hot path's reply as small as Redis can make it.

# ARGV: epoch, run_id, create. Raises the stored epoch to at least ``epoch``.
# With create = '0' (a log whose runs Postgres can rebuild) a missing or lost log
# is refused rather than created empty, and so is one being rebuilt.
FENCE_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'next', 'rebuilding')
if meta[3] then return {'rebuilding', 0} end
if ARGV[3] == '0' then
  if not meta[1] then return {'missing', 0} end
  if (tonumber(meta[2]) or 1) > 1 and redis.call('EXISTS', KEYS[1]) == 0 then
    return {'missing', 0}
  end
end
local stored = tonumber(meta[1]) or 0
local epoch = tonumber(ARGV[1])
if epoch > stored then
  redis.call('HSET', KEYS[2], 'epoch', ARGV[1], 'run_id', ARGV[2])
  redis.call('HSETNX', KEYS[2], 'next', 1)
  return epoch
end
return stored
"""

# Refusals shared by append and close, in the order they are checked.
_GUARD_LUA = """
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'closed', 'next', 'rebuilding')
if meta[4] then return {'rebuilding', 0} end
local stored = tonumber(meta[1]) or 0
local epoch = tonumber(ARGV[1])
local nxt = tonumber(meta[3]) or 1
if stored > 0 and nxt > 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unfenced', 0}  -- the stream was lost (evicted) under its meta: rebuild it
end
if stored > epoch then return {'fenced', stored} end
if stored < epoch then return {'unfenced', stored} end
"""

# ARGV: epoch, first_seq, max_chunks, chunk... Appends the chunks as 0-<seq>.
APPEND_LUA: Final = (
    _GUARD_LUA
    + """
if meta[2] then return {'closed', tonumber(meta[2])} end
if tonumber(ARGV[2]) ~= nxt then return {'conflict', nxt} end
for i = 4, #ARGV do
  redis.call('XADD', KEYS[1], string.format('0-%d', nxt), 'c', ARGV[i])
  nxt = nxt + 1
end
if #ARGV > 3 then
  redis.call('HSET', KEYS[2], 'next', nxt)
  -- Trimming starts only once more than max_chunks were ever appended.
  local limit = tonumber(ARGV[3])
  if nxt - 1 > limit then
    redis.call('XTRIM', KEYS[1], 'MAXLEN', limit)
  end
end
return nxt - 1
"""
)

# ARGV: epoch, retention_ms. Idempotent: closing a closed log changes nothing.
CLOSE_LUA: Final = (
    _GUARD_LUA
    + """
if meta[2] then return tonumber(meta[2]) end
redis.call('XADD', KEYS[1], string.format('0-%d', nxt), 'end', ARGV[1])
redis.call('HSET', KEYS[2], 'closed', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return epoch
"""
)


# --- rebuilding a lost log from Postgres (log/runlog.py, ``RunLog.ensure``) -------------
# A rebuild holds the meta hash's ``rebuilding`` field (a token) while it writes the
# chunks in pages; meanwhile every append, close and fence is refused with
# 'rebuilding' and retried. The meta hash carries a short TTL for as long as the
# rebuild runs, renewed by every page, so a rebuilder that died leaves a log that
# vanishes and is rebuilt again from scratch by the next reader.

# ARGV: token, run_id, lock_ms. Starts a rebuild when the log is missing: no meta,
# or a meta whose stream was lost. Answers 1 (begun), 0 (present) or
# {'rebuilding', 0} (another rebuild holds it). The epoch is set by the end script,
# from what Postgres says once the rebuild holds the log.
REBUILD_BEGIN_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'next', 'rebuilding')
if meta[3] then return {'rebuilding', 0} end
if meta[1] and ((tonumber(meta[2]) or 1) == 1 or redis.call('EXISTS', KEYS[1]) == 1) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], 'next', 1, 'rebuilding', ARGV[1], 'run_id', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# ARGV: token. Gives a rebuild up (the run has no log, or Postgres failed): the log
# is missing again, as it was.
REBUILD_ABORT_LUA: Final = """
if redis.call('HGET', KEYS[2], 'rebuilding') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""

# ARGV: token, lock_ms, max_chunks, chunk... Adds one page of the rebuilt log;
# answers the last seq, or {'lost', 0} when the rebuild no longer holds the log.
REBUILD_PAGE_LUA: Final = """
if redis.call('HGET', KEYS[2], 'rebuilding') ~= ARGV[1] then return {'lost', 0} end
local nxt = tonumber(redis.call('HGET', KEYS[2], 'next'))
for i = 4, #ARGV do
  redis.call('XADD', KEYS[1], string.format('0-%d', nxt), 'c', ARGV[i])
  nxt = nxt + 1
end
redis.call('HSET', KEYS[2], 'next', nxt)
local limit = tonumber(ARGV[3])
if nxt - 1 > limit then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', limit)
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return nxt - 1
"""

# ARGV: token, epoch, closed ('1' for a settled run), retention_ms. Ends the rebuild
# at the run's epoch: the log is open for its owner again, or closed (end marker,
# retention TTL) when the run is settled. Answers the last seq, or {'lost', 0}.
REBUILD_END_LUA: Final = """
if redis.call('HGET', KEYS[2], 'rebuilding') ~= ARGV[1] then return {'lost', 0} end
local nxt = tonumber(redis.call('HGET', KEYS[2], 'next'))
redis.call('HDEL', KEYS[2], 'rebuilding')
redis.call('HSET', KEYS[2], 'epoch', ARGV[2])
if ARGV[3] == '1' then
  redis.call('XADD', KEYS[1], string.format('0-%d', nxt), 'end', ARGV[2])
  redis.call('HSET', KEYS[2], 'closed', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
else
  redis.call('PERSIST', KEYS[2])
  redis.call('PERSIST', KEYS[1])
end
return nxt - 1
"""


# --- quotas of API keys -----------------------------------------------------------------
# Key names of API keys are plain ([A-Za-z0-9_.-]), checked by the store before use.


def submit_bucket_key(namespace: str, key_name: str) -> str:
    """A hash ``{tokens, at}``: the token bucket of one API key's submissions."""
    return f"{namespace}:quota:submits:{key_name}"


def stream_slots_key(namespace: str, key_name: str) -> str:
    """A sorted set of one API key's open event streams, scored by lease expiry (ms)."""
    return f"{namespace}:quota:streams:{key_name}"


# KEYS = [bucket]; ARGV: tokens per millisecond, burst. On the Redis clock, so every
# web process shares one bucket per key. Returns {1, 0} when a token was taken, else
# {0, milliseconds until one is there}.
SUBMIT_BUCKET_LUA: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 1000)
if wait > 0 then return {0, wait} end
return {1, 0}
"""

# KEYS = [slots]; ARGV: slot id, cap, lease ms. Takes (or renews) a slot; slots whose
# lease ran out (a web process that died with streams open) are dropped first.
# Returns 1 when held, 0 when the key is at its cap.
STREAM_SLOT_LUA: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1])
   and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
