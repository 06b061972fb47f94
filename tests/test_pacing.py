"""The sbatch token bucket: at most `burst` submissions at once, then `rate_per_s`; in Redis, one bucket
shared by every worker. The check used here (`over_limit`) is shown to catch an unpaced submitter."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from ggpo_batch.executor.pacing import (
    LocalBucket,
    RedisBucket,
    SubmitPace,
    Unpaced,
    bucket_key,
    make_bucket,
)


def over_limit(times: list[float], pace: SubmitPace, slack: float = 1.0) -> bool:
    """True if some window of t seconds held more than burst + rate x t (+ slack) takes: the bucket's promise."""
    times = sorted(times)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            if j - i + 1 > pace.burst + pace.rate_per_s * (times[j] - start) + slack:
                return True
    return False


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_local_bucket_gives_the_burst_then_the_rate():
    clock = FakeClock()
    pace = SubmitPace(burst=30, rate_per_s=2.0)
    b = LocalBucket(pace, clock=clock, sleep=clock.sleep)
    times = []
    for _ in range(50):
        b.acquire()
        times.append(clock.now)
    assert times[29] == 0.0  # 30 at once
    assert times[30] == pytest.approx(0.5) and times[49] == pytest.approx(10.0)  # then 2 a second
    assert not over_limit(times, pace, slack=0.0)


def test_the_check_catches_an_unpaced_submitter():
    """Planted defect: 50 submissions with no pacing break the limit the check enforces."""
    pace = SubmitPace(burst=30, rate_per_s=2.0)
    u = Unpaced()
    times = []
    for _ in range(50):
        u.acquire()
        times.append(time.monotonic())
    assert over_limit(times, pace)


def test_rate_zero_is_unpaced_and_memory_urls_stay_local():
    assert isinstance(make_bucket(SubmitPace(30, 0)), Unpaced)
    assert isinstance(make_bucket(SubmitPace(30, 2.0), redis_url="memory://"), LocalBucket)


@pytest.mark.redis
def test_redis_bucket_is_shared_by_workers(redis_url):  # type: ignore[no-untyped-def]
    """Three 'workers' (threads, each its own connection and bucket object) share one bucket of 5 at 4/s."""
    pace = SubmitPace(burst=5, rate_per_s=4.0)
    key = bucket_key("pacing-test")
    times: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        b = make_bucket(pace, redis_url=redis_url, user="pacing-test")
        assert isinstance(b, RedisBucket)
        for _ in range(5):
            b.acquire()
            with lock:
                times.append(time.monotonic())

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    took = time.monotonic() - t0
    assert len(times) == 15
    # 5 at once, the other 10 at 4 a second: about 2.5 s; three private buckets would take ~1.25 s
    assert took >= 2.2, took
    assert not over_limit(times, pace, slack=1.0)
    assert redis.Redis.from_url(redis_url).ttl(key) > 0  # the bucket expires when nobody submits
