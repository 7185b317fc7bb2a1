import pytest

from semverlite import Version, latest


def test_parse_and_str():
    v = Version.parse("v1.2.3-rc.1+build.7")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.prerelease == ("rc", "1")
    assert str(v) == "1.2.3-rc.1+build.7"
    for bad in ["1.2", "01.2.3", "1.2.3-", "abc"]:
        with pytest.raises(ValueError):
            Version.parse(bad)


def test_numeric_ordering_of_core_parts():
    assert Version.parse("1.10.0") > Version.parse("1.9.0")
    assert Version.parse("2.0.0") > Version.parse("1.99.99")


def test_release_after_prerelease_and_build_ignored():
    assert Version.parse("1.0.0-rc.1") < Version.parse("1.0.0")
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")


def test_prerelease_identifier_ordering():
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
             "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    versions = [Version.parse(v) for v in chain]
    assert sorted(reversed(versions)) == versions


def test_latest_and_bump():
    assert str(latest(["2.0.0-beta.9", "2.0.0-beta.10"])) == "2.0.0-beta.10"
    assert str(latest(["1.0.0", "1.1.0-rc.1"], include_prereleases=False)) == "1.0.0"
    assert latest([]) is None
    assert str(Version.parse("1.2.3-rc.1").bump("minor")) == "1.3.0"
    with pytest.raises(ValueError):
        Version.parse("1.0.0").bump("build")
