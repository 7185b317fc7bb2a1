"""The task repositories: manifests load, and each repo's tests fail before its fix and pass after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentspec.agents.tasks import TASKS_DIR, Task, TaskError, list_tasks, load_task

TASKS = list_tasks()


def test_tasks_load():
    assert len(TASKS) >= 10
    names = [t.name for t in TASKS]
    assert names == sorted(set(names))
    assert [t.name for t in list_tasks("profile")] == [t.name for t in TASKS if t.split == "profile"]
    assert len(list_tasks("profile")) == 2
    assert len(list_tasks("eval")) == len(TASKS) - 2
    assert len({t.bug for t in TASKS}) >= 5
    for task in TASKS:
        assert task.path == TASKS_DIR / task.name and task.repo == task.path / "repo"
        assert task.issue and task.timeout > 0
        assert load_task(task.path) == task


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_task_files(task: Task):
    files = task.files()
    sources = task.source_files()
    assert sources and set(sources) < set(files)
    assert any(rel.startswith("tests/test_") for rel in files)
    assert not any(rel.startswith("tests/") or rel.endswith("conftest.py") for rel in sources)
    lines = sum(len(files[rel].splitlines()) for rel in sources)
    assert 40 <= lines <= 150, f"{task.name}: {lines} source lines"
    diff = (task.path / "fix.diff").read_text()
    touched = [line[6:] for line in diff.splitlines() if line.startswith("+++ b/")]
    assert touched and set(touched) <= set(sources)
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert 1 <= len(removed) <= 3


def _pytest(repo: Path, timeout: float) -> subprocess.CompletedProcess:
    # Third-party plugins (hypothesis) are not needed by the task tests and double the start-up time.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_fix_makes_tests_pass(task: Task, tmp_path: Path):
    repo = tmp_path / "repo"
    shutil.copytree(task.repo, repo, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    before = _pytest(repo, task.timeout)
    assert before.returncode == 1, f"expected failing tests before the fix:\n{before.stdout}{before.stderr}"
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "apply", str(task.path / "fix.diff")], cwd=repo, check=True)
    after = _pytest(repo, task.timeout)
    assert after.returncode == 0, f"tests still fail after the fix:\n{after.stdout}{after.stderr}"


def _fake_task(root: Path, name: str = "demo", manifest: str | None = None, tests: bool = True) -> Path:
    path = root / name
    (path / "repo" / "demo").mkdir(parents=True)
    (path / "repo" / "demo" / "__init__.py").write_text("X = 1\n")
    if tests:
        (path / "repo" / "tests").mkdir()
        (path / "repo" / "tests" / "test_demo.py").write_text("def test_x():\n    pass\n")
    if manifest is None:
        manifest = (f'name = "{name}"\nsplit = "eval"\nbug = "state"\ntimeout = 30\n'
                    "issue = '''\nIt breaks.\n'''\n")
    (path / "task.toml").write_text(manifest)
    return path


def test_load_task_from_path(tmp_path: Path):
    task = load_task(_fake_task(tmp_path))
    assert (task.name, task.split, task.bug, task.timeout, task.issue) == ("demo", "eval", "state", 30.0, "It breaks.")
    assert task.files() == {"demo/__init__.py": "X = 1\n", "tests/test_demo.py": "def test_x():\n    pass\n"}
    assert task.source_files() == ["demo/__init__.py"]


def test_unknown_task_lists_known_names():
    with pytest.raises(TaskError, match="no-such-task") as err:
        load_task("no-such-task")
    assert all(t.name in str(err.value) for t in TASKS)


def test_folder_without_manifest(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no task.toml"):
        load_task(tmp_path / "empty")


def test_manifest_missing_issue(tmp_path: Path):
    path = _fake_task(tmp_path, manifest='name = "demo"\nsplit = "eval"\nbug = "state"\ntimeout = 30\n')
    with pytest.raises(TaskError, match="missing key 'issue'"):
        load_task(path)


def test_manifest_invalid_values(tmp_path: Path):
    bad_split = _fake_task(tmp_path, "a", 'name = "a"\nsplit = "train"\nbug = "x"\ntimeout = 1\nissue = "i"\n')
    with pytest.raises(TaskError, match="split"):
        load_task(bad_split)
    with pytest.raises(TaskError, match="invalid TOML"):
        load_task(_fake_task(tmp_path, "b", "name = \n"))
    with pytest.raises(TaskError, match="folder name"):
        load_task(_fake_task(tmp_path, "c", 'name = "other"\nsplit = "eval"\nbug = "x"\ntimeout = 1\nissue = "i"\n'))


def test_repo_without_tests(tmp_path: Path):
    with pytest.raises(TaskError, match="no tests"):
        load_task(_fake_task(tmp_path, tests=False))


def test_unknown_split():
    with pytest.raises(TaskError, match="unknown split"):
        list_tasks("train")
