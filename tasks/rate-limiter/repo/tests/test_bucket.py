import pytest

from throttle import RateLimited, TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_initial_burst_then_limited():
    clock = FakeClock()
    bucket = TokenBucket(rate=5, capacity=10, clock=clock)
    assert sum(bucket.try_acquire() for _ in range(15)) == 10
    clock.now += 0.2
    assert bucket.try_acquire()
    assert not bucket.try_acquire()


def test_wait_time():
    clock = FakeClock()
    bucket = TokenBucket(rate=2, capacity=4, clock=clock)
    assert bucket.wait_time(4) == 0
    bucket.try_acquire(4)
    assert bucket.wait_time(1) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        bucket.wait_time(5)


def test_blocking_acquire_sleeps():
    clock = FakeClock()
    bucket = TokenBucket(rate=1, capacity=1, clock=clock)
    bucket.acquire(sleep=clock.sleep)
    bucket.acquire(sleep=clock.sleep)
    assert clock.now == pytest.approx(101.0)
    with pytest.raises(RateLimited) as err:
        bucket.acquire(block=False)
    assert err.value.retry_after == pytest.approx(1.0)


def test_idle_bucket_never_exceeds_capacity():
    clock = FakeClock()
    bucket = TokenBucket(rate=5, capacity=10, clock=clock)
    clock.now += 60
    assert bucket.available == 10
    assert sum(bucket.try_acquire() for _ in range(50)) == 10
