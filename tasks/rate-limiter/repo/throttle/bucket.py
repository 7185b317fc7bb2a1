"""A token-bucket rate limiter with an injectable clock.

The bucket holds up to `capacity` tokens and gains `rate` tokens per second.
Each request takes tokens; a request is allowed only if enough tokens are
available. A full bucket therefore permits a burst of `capacity` requests,
after which requests are limited to `rate` per second.
"""

from __future__ import annotations

import time
from typing import Callable


class RateLimited(Exception):
    """Raised by `acquire` when the caller does not want to wait."""

    def __init__(self, retry_after: float):
        super().__init__(f"rate limited; retry after {retry_after:.3f}s")
        self.retry_after = retry_after


class TokenBucket:
    def __init__(self, rate: float, capacity: float,
                 clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be positive")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = float(capacity)
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._updated)
        self._tokens = self._tokens + elapsed * self.rate
        self._updated = now

    @property
    def available(self) -> float:
        """Tokens available right now."""
        self._refill()
        return self._tokens

    def wait_time(self, tokens: float = 1) -> float:
        """Seconds until `tokens` tokens will be available (0 if they are now)."""
        if tokens > self.capacity:
            raise ValueError(f"cannot request {tokens} tokens from a bucket of {self.capacity}")
        missing = tokens - self.available
        return max(0.0, missing / self.rate)

    def try_acquire(self, tokens: float = 1) -> bool:
        """Take `tokens` tokens if available; never blocks."""
        if self.wait_time(tokens) > 0:
            return False
        self._tokens -= tokens
        return True

    def acquire(self, tokens: float = 1, block: bool = True,
                sleep: Callable[[float], None] = time.sleep) -> None:
        """Take `tokens` tokens, sleeping until they are available if `block`."""
        while (delay := self.wait_time(tokens)) > 0:
            if not block:
                raise RateLimited(delay)
            sleep(delay)
        self._tokens -= tokens
