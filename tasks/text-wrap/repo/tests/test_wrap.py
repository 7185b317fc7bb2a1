import pytest

from wraptext import fill, indent, shorten, wrap


def test_short_text_is_one_line():
    assert wrap("hello   world", 20) == ["hello world"]
    assert wrap("", 10) == []


def test_wraps_at_word_boundaries():
    assert wrap("one two three four", 8) == ["one two", "three", "four"]


def test_line_may_be_exactly_width():
    assert wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]
    assert fill("the quick brown fox", 9) == "the quick\nbrown fox"


def test_long_words_are_split():
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_indent_and_shorten():
    assert indent("a\n\nb\n", "> ") == "> a\n\n> b\n"
    assert shorten("Hello  world, how are you?", 18) == "Hello world, [...]"
    assert shorten("fits fine", 20) == "fits fine"
