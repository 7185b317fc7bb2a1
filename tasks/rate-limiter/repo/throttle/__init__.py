"""Client-side rate limiting."""

from .bucket import RateLimited, TokenBucket

__all__ = ["RateLimited", "TokenBucket"]
