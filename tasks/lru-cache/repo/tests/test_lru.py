import pytest

from memo import LRUCache, cached


def test_put_and_get():
    cache = LRUCache(3)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zzz", "dflt") == "dflt"
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    with pytest.raises(ValueError):
        LRUCache(0)


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    for key, value in [("a", 1), ("b", 2), ("c", 3)]:
        cache.put(key, value)
    assert cache.keys() == ["b", "c"]
    assert cache.stats.evictions == 1


def test_put_existing_key_refreshes_it():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache
    assert cache.get("a") == 10


def test_get_marks_key_as_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache
    assert cache.keys() == ["a", "c"]


def test_cached_decorator():
    calls = []

    @cached(capacity=2)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(2), square(3), square(2), square(4), square(2)] == [4, 9, 4, 16, 4]
    assert calls == [2, 3, 4]
    assert square.cache.stats.hit_rate == pytest.approx(0.4)
