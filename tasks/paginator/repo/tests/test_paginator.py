import pytest

from pager import PageNotFound, Paginator


def test_partial_last_page():
    p = Paginator(list(range(21)), per_page=10)
    assert p.num_pages == 3
    last = p.page(3)
    assert last.items == [20]
    assert (last.start_index, last.end_index) == (21, 21)
    assert not last.has_next and last.has_previous


def test_exact_multiple_of_page_size():
    p = Paginator(list(range(20)), per_page=10)
    assert p.num_pages == 2
    assert list(p.page_range) == [1, 2]
    assert not p.page(2).has_next
    with pytest.raises(PageNotFound):
        p.page(3)


def test_empty_sequence_has_one_page():
    p = Paginator([], per_page=5)
    assert p.num_pages == 1
    page = p.page(1)
    assert page.items == [] and page.start_index == 0 and page.end_index == 0


def test_invalid_numbers():
    p = Paginator("abcdef", per_page=4)
    assert p.page(1).items == ["a", "b", "c", "d"]
    with pytest.raises(PageNotFound):
        p.page(0)
    with pytest.raises(TypeError):
        p.page("1")
    with pytest.raises(ValueError):
        Paginator([1], per_page=0)
