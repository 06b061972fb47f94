"""Pacing of sbatch: a token bucket, so a burst of submissions stays under the controller's RPC limit.

Slurm (from 23.02) rate-limits RPCs per user at slurmctld with a token bucket of 30 tokens refilled
at 2 per second by default; a client over it is answered "slow down" and its users' sbatch fail.
Every sbatch here first takes one token from a bucket of the same shape (`SubmitPace`, set per
cluster in its profile: `submit_burst`, `submit_rate_per_s`).

The bucket lives in Redis (`RedisBucket`) whenever workers run: the limit is per user across every
host that submits, each worker is a process of its own (an in-process bucket would start full in
every one), and the workers already share that Redis for the queue. `LocalBucket` is for one
process without Redis (the CLI's inline mode, tests, the benchmark's own baseline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# Slurm's default per-user limit (src/slurmctld/rate_limit.c): 30-token bucket, 2 tokens a second.
DEFAULT_BURST = 30
DEFAULT_RATE_PER_S = 2.0


@dataclass(frozen=True)
class SubmitPace:
    """The bucket's shape: `burst` tokens at most, refilled at `rate_per_s`; rate 0 means unpaced."""

    burst: int = DEFAULT_BURST
    rate_per_s: float = DEFAULT_RATE_PER_S

    @property
    def unpaced(self) -> bool:
        return self.rate_per_s <= 0


class Bucket(Protocol):
    def acquire(self) -> float:
        """Take one token, sleeping until there is one; return the seconds waited."""


class Unpaced:
    """No pacing (rate 0 in the profile, or a test that submits as fast as it can)."""

    def acquire(self) -> float:
        return 0.0


class LocalBucket:
    """A token bucket in this process (thread-safe): for one submitter without Redis."""

    def __init__(self, pace: SubmitPace, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.pace = pace
        self._clock, self._sleep = clock, sleep
        self._tokens = float(pace.burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _take(self) -> float:
        """0 if a token was taken, else the seconds until one is due."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.pace.burst), self._tokens + (now - self._at) * self.pace.rate_per_s)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.pace.rate_per_s

    def acquire(self) -> float:
        waited = 0.0
        while (wait := self._take()) > 0:
            self._sleep(wait)
            waited += wait
        return waited


# KEYS[1]: the bucket's hash; ARGV: burst, rate per s. Redis's own clock, so hosts' clocks never matter.
_TAKE = """
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(wait)
"""


class RedisBucket:
    """The token bucket in Redis, shared by every worker of the user on every host."""

    def __init__(self, redis: Any, key: str, pace: SubmitPace, sleep: Callable[[float], None] = time.sleep) -> None:
        self.key, self.pace, self._sleep = key, pace, sleep
        self._script = redis.register_script(_TAKE)

    def acquire(self) -> float:
        waited = 0.0
        while True:
            wait = float(self._script(keys=[self.key], args=[self.pace.burst, self.pace.rate_per_s]))
            if wait <= 0:
                return waited
            self._sleep(wait)
            waited += wait


def bucket_key(user: str) -> str:
    """The Redis key of a Slurm user's sbatch bucket (the controller limits per user)."""
    return f"ggpo:sbatch-bucket:{user}"


def make_bucket(pace: SubmitPace, *, redis_url: str | None = None, user: str | None = None) -> Bucket:
    """The bucket for `pace`: in Redis when a (non-memory) Redis URL is given, else in this process."""
    if pace.unpaced:
        return Unpaced()
    if redis_url and not redis_url.startswith("memory://"):
        import getpass

        from redis import Redis

        return RedisBucket(Redis.from_url(redis_url), bucket_key(user or getpass.getuser()), pace)
    return LocalBucket(pace)
