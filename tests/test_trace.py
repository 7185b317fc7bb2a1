import gzip
import json

import pytest

from agentspec.trace import TraceError, read_sessions, write_sessions
from conftest import session_obj, write_jsonl


def test_round_trip_plain_and_gzip(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [session_obj("s1"), session_obj("s2")])
    sessions, errors = read_sessions([src])
    assert [s.id for s in sessions] == ["s1", "s2"] and errors == []
    for name in ("b.jsonl", "b.jsonl.gz"):
        write_sessions(tmp_path / name, sessions)
        again, _ = read_sessions([tmp_path / name])
        assert [s.to_json() for s in again] == [s.to_json() for s in sessions]
    with gzip.open(tmp_path / "b.jsonl.gz", "rt") as f:
        assert json.loads(f.readline())["format"] == "agentspec.trace/1"


def test_session_fields(tmp_path):
    (s,), _ = read_sessions([write_jsonl(tmp_path / "a.jsonl", [session_obj("s1", task="t")])])
    assert s.task == "t"
    assert s.structure == (("```diff", "```"),)
    assert s.calls[1].role == "code" and s.calls[1].turn == 2
    assert s.output(s.calls[0]).startswith("```diff")


@pytest.mark.parametrize("mutate, needle", [
    (lambda o: o.pop("threads"), "'threads'"),
    (lambda o: o["calls"][0].pop("message"), "call 0 lacks"),
    (lambda o: o["calls"][0].update(message=1), "not an assistant one"),
    (lambda o: o["calls"][1].update(thread=7), "thread 7"),
    (lambda o: o["threads"][0][0].update(role="robot"), "message 0 needs a role"),
    (lambda o: o["meta"].update(structure=[["```"]]), "meta.structure"),
])
def test_bad_session_names_file_line_and_session(tmp_path, mutate, needle):
    bad = session_obj("broken")
    mutate(bad)
    path = write_jsonl(tmp_path / "t.jsonl", [session_obj("ok"), bad])
    sessions, errors = read_sessions([path])
    assert [s.id for s in sessions] == ["ok"]
    (err,) = errors
    assert f"{path}:2:" in str(err) and needle in str(err)
    if "id" in bad:
        assert "broken" in str(err)
    with pytest.raises(TraceError):
        read_sessions([path], strict=True)


def test_not_json_and_all_bad_and_missing(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ["{not json", session_obj("ok")])
    _, errors = read_sessions([path])
    assert "t.jsonl:1: not valid JSON" in str(errors[0])
    with pytest.raises(TraceError, match="no valid session"):
        read_sessions([write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]"])])
    with pytest.raises(TraceError, match="no such trace file"):
        read_sessions([tmp_path / "missing.jsonl.gz"])
    (tmp_path / "corrupt.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read"):
        read_sessions([tmp_path / "corrupt.jsonl.gz"])


def test_unknown_keys_are_ignored(tmp_path):
    obj = session_obj("s1")
    obj["extra"] = {"anything": 1}
    obj["calls"][0]["latency_ms"] = 12
    sessions, errors = read_sessions([write_jsonl(tmp_path / "a.jsonl", [obj])])
    assert len(sessions) == 1 and not errors
