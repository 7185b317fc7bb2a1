"""scripts/gpu_cost_probe.py on the CPU with the tiny random Llama: it writes a loadable profile."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentspec.costs import load_profile  # noqa: E402
from conftest import load_script  # noqa: E402


@pytest.fixture(scope="module")
def probe():
    return load_script("gpu_cost_probe")


def tiny_args(out: Path, *extra: str) -> list[str]:
    return ["--config", "tiny", "--device", "cpu", "--layers", "2", "--batches", "1,2",
            "--tokens", "1,2,5", "--context", "32", "--repeats", "1", "--threads", "1",
            "--out", str(out), *extra]


def test_probe_writes_loadable_profile(probe, tmp_path, capsys):
    out = tmp_path / "p.json"
    plot = tmp_path / "p.png"
    assert probe.main(tiny_args(out, "--plot", str(plot))) == 0
    prof = load_profile(out)
    assert prof.backend == "torch" and prof.model == "llama-tiny-random-2layers"
    assert prof.dtype == "float32" and prof.context_tokens == 32
    assert "CPU" in prof.machine and prof.created.endswith("Z")
    assert sorted(prof.batches) == [1, 2]
    for c in prof.batches.values():
        assert c.tokens_per_row == [1, 2, 5] and len(c.seconds) == 3 and c.lam >= 0
    assert prof.extra["probe"]["cache"] == "static"
    assert "packed" in prof.extra["probe"]["attention"]
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    assert AttentionInterface._global_mapping["sdpa"] is sdpa_attention_forward  # put back
    assert prof.extra["probe"]["layers"] == 2
    table = capsys.readouterr().out
    assert "lambda" in table and "wrote" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert plot.stat().st_size > 0


def test_probe_falls_back_to_a_dynamic_cache(probe, tmp_path, monkeypatch):
    from transformers import StaticCache

    def no_crop(self, tokens_to_remove):
        raise NotImplementedError("no crop in this version")

    monkeypatch.setattr(StaticCache, "crop", no_crop, raising=False)
    out = tmp_path / "d.json"
    assert probe.main(tiny_args(out, "--batches", "1")) == 0
    prof = load_profile(out)
    assert prof.extra["probe"]["cache"] == "dynamic" and sorted(prof.batches) == [1]


def test_probe_rejects_tokens_without_1(probe, tmp_path):
    assert probe.main(tiny_args(tmp_path / "x.json", "--tokens", "2,3")) == 2
    assert not (tmp_path / "x.json").exists()


def test_probe_out_of_memory_skips_or_keeps_points(probe, tmp_path, monkeypatch):
    real_forward = probe.Runner.forward
    real_prefill = probe.Runner.prefill

    def forward(self, cache, ids, context):
        if ids.shape == (2, 5):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(self, cache, ids, context)

    def prefill(self, cache, b, context):
        if b == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real_prefill(self, cache, b, context)

    monkeypatch.setattr(probe.Runner, "forward", forward)
    monkeypatch.setattr(probe.Runner, "prefill", prefill)
    out = tmp_path / "o.json"
    assert probe.main(tiny_args(out, "--batches", "1,2,4")) == 0
    prof = load_profile(out)
    assert sorted(prof.batches) == [1, 2]
    assert prof.batches[2].tokens_per_row == [1, 2]  # the points before the OOM
    notes = prof.extra["probe"]["notes"]
    assert notes == {"2": "out of memory at t=5", "4": "out of memory at prefill"}


def test_probe_time_budget_skips_later_batches(probe, tmp_path):
    out = tmp_path / "t.json"
    assert probe.main(tiny_args(out, "--max-seconds", "0")) == 0
    prof = load_profile(out)
    assert sorted(prof.batches) == [1]
    assert prof.extra["probe"]["notes"]["2"].startswith("skipped: time budget")
