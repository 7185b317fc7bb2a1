import pytest

from urlnorm import normalize, same_page


def test_scheme_host_and_port():
    assert normalize("HTTP://Example.COM:80") == "http://example.com/"
    assert normalize("https://example.com:8443/x") == "https://example.com:8443/x"


def test_path_and_fragment():
    assert normalize("https://example.com/docs/#intro") == "https://example.com/docs"
    assert normalize("https://example.com") == "https://example.com/"


def test_query_is_sorted_and_cleaned():
    url = "https://shop.example/items?b=2&utm_source=mail&a=1&fbclid=x"
    assert normalize(url) == "https://shop.example/items?a=1&b=2"


def test_www_prefix_dropped():
    assert normalize("https://www.example.com/a") == "https://example.com/a"
    assert same_page("http://www.example.com/", "http://example.com")


def test_hosts_starting_with_w_are_kept():
    assert normalize("https://web.dev/learn/") == "https://web.dev/learn"
    assert normalize("http://www.wiki.org") == "http://wiki.org/"


def test_rejects_unsupported_urls():
    for bad in ["ftp://example.com/", "https:///path", "example.com"]:
        with pytest.raises(ValueError):
            normalize(bad)
