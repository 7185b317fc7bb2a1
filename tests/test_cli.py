import inspect
import json
import re

import pytest
from typer.testing import CliRunner

from agentspec.cli import app, models_app
from conftest import session_obj, write_jsonl

runner = CliRunner()


def bench(*args, model):
    return runner.invoke(app, ["bench", "--model", str(model), *map(str, args)])


def test_bench_writes_the_report_and_plot(tmp_path, trace, tiny_model_dir):
    r = bench("--traces", trace, "--methods", "plain,ngram,suffix,full", "--json",
              tmp_path / "r.json", "--plot", tmp_path / "r.png", model=tiny_model_dir)
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert list(report["methods"]) == ["plain", "ngram", "suffix", "full"]
    assert report["methods"]["plain"]["al"] == 1.0
    assert report["sessions"] < 8  # the other tasks went to profiling
    assert (report["seed"], report["task_split"]) == (0, True)  # how to repeat the sample
    assert report["profile_sessions"] == 8 - report["sessions"]
    # replayed, the policies serve the profiling split first; suffix's tree holds its outputs
    given = {name: report["methods"][name]["knowledge"] for name in ("suffix", "full")}
    assert given["full"]["served_sessions"] == report["profile_sessions"]
    assert given["suffix"]["served_sessions"] == 0
    assert given["full"]["global_seed_outputs"] == given["suffix"]["global_seed_outputs"] > 0
    assert given["full"]["kmax_profile"] is given["suffix"]["kmax_profile"] is False
    assert (tmp_path / "r.png").stat().st_size > 1000
    # no live progress bar outside a terminal: a line as each method finishes
    for method in report["methods"]:
        assert f"[bench] {method}: " in r.output


def test_a_few_bad_sessions_are_skipped_with_a_count(tmp_path, tiny_model_dir):
    bad = session_obj("broken")
    bad["calls"][0]["message"] = 0
    path = write_jsonl(tmp_path / "t.jsonl", [session_obj("a"), "{oops", bad,
                                              session_obj("b")])
    r = bench("--traces", path, "--no-split", "--methods", "plain", model=tiny_model_dir)
    assert r.exit_code == 0, r.output
    assert "skipped 2 malformed session(s)" in r.output


@pytest.mark.parametrize("args, message", [
    (["--traces", "missing.jsonl.gz"], "no such trace file"),
    (["--methods", "plain,nope"], "unknown method(s) nope"),
    (["--structure", "[[\"```\"]]"], "structure"),
    (["--cost-profile", "corrupt.json"], "corrupt.json"),
    (["--cost-profile", "batches.json"], "batches.json: 'batches' must be an object"),
    (["--cost-profile", "seconds.json"], "seconds.json: bad 'batches' entry: no 'seconds'"),
    (["--kmax", "missing-kmax.json"], "no such Kmax table"),
    (["--kmax", "kmax.json", "--methods", "agspec"],
     "kmax.json: bad Kmax table: 'kmax' must be an object of role: integer"),
    (["--backend", "tpu"], "backend 'tpu' is not available"),
    (["--sessions", "0"], "at least 1"),
    (["--backend", "mlx", "--batch", "4"], "generates one session at a time"),
    (["--batch", "1,4"], "several sizes only with --backend vllm"),
    (["--backend", "mlx", "--outputs", "served.json"], "goes with --backend replay"),
    (["--save-outputs", "served.json"], "goes with --backend mlx or vllm"),
    (["--outputs", "corrupt.json"], "--outputs corrupt.json: cannot read it"),
    (["--outputs", "missing.json"], "--outputs missing.json: cannot read it"),
])
def test_bad_input_exits_2_with_one_message(tmp_path, trace, tiny_model_dir, monkeypatch, args,
                                            message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.json").write_text("{")
    (tmp_path / "batches.json").write_text('{"format": "agentspec.cost/1", "batches": "x"}')
    (tmp_path / "seconds.json").write_text('{"format": "agentspec.cost/1", "batches": '
                                           '{"1": {"tokens_per_row": [1], "lambda": 0.1}}}')
    (tmp_path / "kmax.json").write_text('{"format": "agentspec.kmax/1", "kmax": "x", '
                                        '"lambda": 0.2}')
    if "--traces" not in args:
        args = ["--traces", str(trace), *args]
    r = bench(*args, model=tiny_model_dir)
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output


def test_a_file_of_garbage_and_a_bad_flag(tmp_path, tiny_model_dir):
    garbage = tmp_path / "g.jsonl"
    garbage.write_text("not json\n")
    r = bench("--traces", garbage, model=tiny_model_dir)
    assert r.exit_code == 2 and "no valid session" in r.output
    r = runner.invoke(app, ["bench", "--traces", str(garbage), "--frobnicate"])
    assert r.exit_code == 2


def test_unknown_model_is_a_clear_error(trace):
    r = runner.invoke(app, ["bench", "--traces", str(trace), "--model", "no-such-model"])
    assert r.exit_code == 2 and "no-such-model" in r.output


def test_profile_kmax_writes_a_table(tmp_path, trace, tiny_model_dir):
    out = tmp_path / "kmax.json"
    r = runner.invoke(app, ["profile-kmax", "--traces", str(trace), "--lambda", "0.2",
                            "--out", str(out), "--part", "all", "--model", str(tiny_model_dir),
                            "--plot", str(tmp_path / "k.png")])
    assert r.exit_code == 0, r.output
    table = json.loads(out.read_text())
    assert table["format"] == "agentspec.kmax/1" and table["kmax"]["code"] >= 1
    r = runner.invoke(app, ["bench", "--traces", str(trace), "--methods", "agspec",
                            "--kmax", str(out), "--model", str(tiny_model_dir)])
    assert r.exit_code == 0, r.output


def test_every_command_has_help_with_examples():
    for cmd in (["bench"], ["profile-kmax"], ["profile-lambda"], ["models", "pull"],
                ["models", "list"]):
        r = runner.invoke(app, [*cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.output


def test_help_prints_each_paragraph_unbroken():
    # each paragraph of a command's docstring is one printed line on a wide terminal
    for cmd in (["bench"], ["run-agent"], ["serve"], ["import-trace"], ["models", "pull"]):
        r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "1000"})
        lines = [" ".join(line.split()) for line in r.output.splitlines()]
        info = next(i for i in (*app.registered_commands, *models_app.registered_commands)
                    if (i.name or i.callback.__name__) == cmd[-1])
        for paragraph in inspect.cleandoc(info.callback.__doc__).split("\n\n"):
            text = " ".join(re.sub(r"\[/?\w*\]", "", paragraph).split())
            assert text in lines, (cmd, text)


def _served(path, model_name, calls, output=(5, 6, 7, 5, 6, 7, 5, 6), max_tokens=8):
    """An outputs file as a real backend's bench writes it (--save-outputs)."""
    from agentspec.bench import write_outputs

    write_outputs({call: list(output) for call in calls}, path, model_name, [], max_tokens)
    return path


def test_a_replay_of_a_real_backends_outputs(tmp_path, trace, tiny_model_dir):
    calls = [f"s{i}#{m}" for i in range(8) for m in (0, 1)]
    served = _served(tmp_path / "served.json", tiny_model_dir.name, calls)
    r = bench("--traces", trace, "--no-split", "--outputs", served, "--methods", "plain,full",
              "--json", tmp_path / "r.json", model=tiny_model_dir)
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["outputs"] == str(served)  # the report says whose text it replayed
    assert report["methods"]["plain"]["output_tokens"] == 8 * len(calls)
    assert report["methods"]["full"]["al"] > 1.0  # "5 6 7" repeats: copies hit


@pytest.mark.parametrize("change, message", [
    (lambda calls, name: (calls[1:], name, None), "has no output for call s0#0"),
    (lambda calls, name: (calls, "another-model", None), "are 'another-model' tokens"),
    (lambda calls, name: (calls, name, ["5"]), "is not a list of token ids"),
])
def test_a_replay_of_outputs_that_do_not_fit_is_one_message(tmp_path, trace, tiny_model_dir,
                                                            change, message):
    calls, name, output = change([f"s{i}#{m}" for i in range(8) for m in (0, 1)],
                                 tiny_model_dir.name)
    served = _served(tmp_path / "served.json", name, calls, *([output] if output else []))
    r = bench("--traces", trace, "--no-split", "--outputs", served, "--methods", "plain",
              model=tiny_model_dir)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("max_tokens, message", [
    (0, "max_tokens must be a positive integer, not 0"),
    ("128", "max_tokens must be a positive integer, not '128'"),
    (5, "the output of call s0#0 has 8 tokens, over the file's max_tokens 5"),
])
def test_outputs_with_a_bad_budget_are_one_message(tmp_path, trace, tiny_model_dir,
                                                   max_tokens, message):
    served = _served(tmp_path / "served.json", tiny_model_dir.name,
                     [f"s{i}#{m}" for i in range(8) for m in (0, 1)])
    data = json.loads(served.read_text())
    served.write_text(json.dumps({**data, "max_tokens": max_tokens}))
    r = bench("--traces", trace, "--no-split", "--outputs", served, "--methods", "plain",
              model=tiny_model_dir)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
