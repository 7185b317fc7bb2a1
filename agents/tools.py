"""The `run` role's tools: apply a patch to a fresh copy of the repository, run its tests.

The task's own folder is never written: every attempt gets its own copy under a work
folder, and every subprocess has a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agentspec.agents.patch import PatchError, apply_patch, extract_diff

LOG_LINES = 40  # the tail of a test log the model sees
LOG_CHARS = 3000


@dataclass
class TestRun:
    """What happened to one patch."""

    diff: str  # the diff found in the model's output ("" when there was none)
    applied: bool
    passed: bool
    output: str  # what the run role is shown: apply notes and the test log's tail
    notes: list[str] = field(default_factory=list)


def copy_repo(repo: Path, dest: Path) -> Path:
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return dest


def tail(text: str, lines: int = LOG_LINES, chars: int = LOG_CHARS) -> str:
    kept = "\n".join(text.rstrip().splitlines()[-lines:])
    return kept[-chars:]


def run_pytest(root: Path, timeout: float) -> tuple[bool, str]:
    """(passed, log) of `python -m pytest` in `root`, killed after `timeout` seconds."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    # no plugin autoload: the agent's own environment has plugins the repo does not need
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"pytest did not finish in {timeout:g} s and was stopped"
    return p.returncode == 0, (p.stdout + p.stderr)


def try_patch(model_output: str, repo: Path, workdir: Path, timeout: float) -> TestRun:
    """Apply the diff in `model_output` to a copy of `repo` made in `workdir`; run the tests."""
    try:
        diff = extract_diff(model_output)
    except PatchError as e:
        return TestRun("", False, False, f"No patch: {e}.")
    root = copy_repo(repo, workdir)
    try:
        applied = apply_patch(diff, root)
    except PatchError as e:
        return TestRun(diff, False, False, f"The patch does not apply: {e}.")
    head = f"Applied ({applied.mode}) to {', '.join(applied.files)}."
    if applied.notes:
        head += "\n" + "\n".join(applied.notes)
    passed, log = run_pytest(root, timeout)
    return TestRun(diff, True, passed, f"{head}\n$ python -m pytest -q\n{tail(log)}",
                   list(applied.notes))
