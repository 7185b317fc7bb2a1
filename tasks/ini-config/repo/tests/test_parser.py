import pytest

from iniconf import ConfigError, parse

SAMPLE = """
# application settings
[server]
Host = example.org
port = 8080   ; default is 80
debug = off

[paths]
data = /var/lib/app#1
"""


def test_sections_and_keys():
    cfg = parse(SAMPLE)
    assert set(cfg.sections) == {"server", "paths"}
    assert cfg.get("server", "host") == "example.org"


def test_typed_getters():
    cfg = parse(SAMPLE)
    assert cfg.getint("server", "port") == 8080
    assert cfg.getbool("server", "debug") is False
    assert cfg.getint("server", "missing", 5) == 5


def test_comment_marker_inside_value_is_kept():
    assert parse(SAMPLE).get("paths", "data") == "/var/lib/app#1"


def test_value_may_contain_equals_sign():
    cfg = parse("[db]\nurl = postgres://h/app?sslmode=require\n")
    assert cfg.get("db", "url") == "postgres://h/app?sslmode=require"


def test_errors_carry_line_numbers():
    with pytest.raises(ConfigError) as err:
        parse("[a]\nx = 1\njust words\n")
    assert err.value.lineno == 3
    with pytest.raises(ConfigError):
        parse("x = 1\n")
    with pytest.raises(ConfigError):
        parse("[broken\n")
