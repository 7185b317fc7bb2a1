"""scripts/copy_bound.py: the copy bound on hand-made calls, and on a trace it bounds the ladder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from agentspec.cli import app
from conftest import load_script, session_obj, write_jsonl


@pytest.fixture(scope="module")
def cb():
    return load_script("copy_bound")


def arr(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, np.int64)


def test_a_loop_is_copied_from_its_first_period_never_from_itself(cb):
    out = arr(5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8)
    empty = cb.Occurrences(arr(), 2)
    # [7, 8] and [8, 5] occur only where they are being written; [5, 6] first occurred at the
    # start, and the copy from there runs on through the output it is writing
    assert cb.call_bound(arr(1, 2, 3), out, None, empty, 2, 64) == [0, 0, 0, 0, 0, 0, 6]


def test_g_copies_need_the_context_length_and_stop_at_max_k(cb):
    g_text = arr(9, 5, 6, 7, -1)
    assert cb.call_bound(arr(9), arr(5, 6, 7), None, cb.Occurrences(g_text, 1), 1, 64) == [3]
    assert cb.call_bound(arr(9), arr(5, 6, 7), None, cb.Occurrences(g_text, 2), 2, 64) == [0, 2]
    assert cb.call_bound(arr(9), arr(5, 6, 7), None, cb.Occurrences(g_text, 1), 1, 2) == [2]


def test_the_best_occurrence_wins_not_the_latest(cb):
    earlier = cb.Occurrences(arr(1, 2, 3, 4, -1, 1, 2, 9), 2)
    assert cb.call_bound(arr(1, 2), arr(3, 4), earlier, cb.Occurrences(arr(), 2), 2, 64) == [2]


def test_no_drafter_of_the_ladder_beats_the_bound(cb, tmp_path, tiny_model_dir):
    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}", task=f"task{i}")
                                               for i in range(8)])
    r = CliRunner().invoke(app, ["bench", "--model", str(tiny_model_dir), "--traces", str(trace),
                                 "--methods", "plain,global,full", "--json",
                                 str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    rows = cb.main(["--traces", str(trace), "--model", str(tiny_model_dir), "--context", "2,3",
                    "--frequency", "--json", str(tmp_path / "b.json")])
    bound = {row["source"]: row for row in rows}
    assert bound["L >= 2"]["output_tokens"] == report["methods"]["full"]["output_tokens"]
    assert bound["L >= 2"]["al"] >= bound["L >= 3"]["al"] > 1.0  # the 2nd patch repeats the 1st
    # global drafts from matches of 2 tokens or more; full from those and the frequency tree
    assert report["methods"]["global"]["al"] <= bound["L >= 2"]["al"] + 1e-9
    assert report["methods"]["full"]["al"] <= bound["L >= 2 or frequency"]["al"] + 1e-9
    assert bound["L >= 2 or frequency"]["al"] >= max(bound["L >= 2"]["al"],
                                                    bound["frequency"]["al"])
    assert json.loads((tmp_path / "b.json").read_text())["bounds"] == rows


def test_the_frequency_source_drafts_what_past_outputs_repeat(cb):
    from agentspec.match import Corpus

    source = cb.FrequencySource(Corpus(min_context=1), Corpus(min_context=1))
    source.outputs.extend([5, 6, 7, 8, 9])
    source.outputs.end_document()
    # after 5 6 the outputs draft 7 8 (no further than they matched); the call's output
    # joins the session's text as it is written, and the outputs once it ends, each after
    # its lead (the prompt's last tokens, here all three)
    assert cb.call_bound(arr(1, 5, 6), arr(7, 8, 4), None, None, None, 64, source) == [2]
    assert len(source.session) == 6 and len(source.outputs) == 11
