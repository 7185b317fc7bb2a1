"""Task repositories for the built-in agent: a buggy repo, an issue, and a manifest.

Each task lives in `tasks/<name>/` with a `task.toml` manifest (name, split,
bug, timeout, issue) and a `repo/` folder holding the code and its pytest tests.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"
SPLITS = ("eval", "profile")
MANIFEST_KEYS = {"name": str, "split": str, "bug": str, "timeout": (int, float), "issue": str}


class TaskError(Exception):
    """A task is unknown or its folder is malformed."""


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    repo: Path
    issue: str
    split: str
    bug: str
    timeout: float

    def _python_files(self) -> list[Path]:
        return sorted(p for p in self.repo.rglob("*.py") if "__pycache__" not in p.parts)

    def files(self) -> dict[str, str]:
        """Every .py file of the repo, tests included: relative posix path -> text."""
        return {p.relative_to(self.repo).as_posix(): p.read_text() for p in self._python_files()}

    def source_files(self) -> list[str]:
        """Relative paths of the .py files that are not tests or conftest.py."""
        rels = [p.relative_to(self.repo) for p in self._python_files()]
        return [r.as_posix() for r in rels
                if r.parts[0] != "tests" and r.name != "conftest.py" and not r.name.startswith("test_")]


def _known_names() -> list[str]:
    return sorted(p.parent.name for p in TASKS_DIR.glob("*/task.toml"))


def load_task(name_or_path: str | Path) -> Task:
    """Load a task by name (a folder of TASKS_DIR) or by the path to its folder."""
    path = Path(name_or_path)
    if isinstance(name_or_path, str) and (TASKS_DIR / name_or_path).is_dir():
        path = TASKS_DIR / name_or_path
    elif not path.is_dir():
        raise TaskError(f"unknown task {str(name_or_path)!r}; known tasks: "
                        f"{', '.join(_known_names()) or '(none)'}")
    manifest = path / "task.toml"
    if not manifest.is_file():
        raise TaskError(f"{path}: no task.toml")
    try:
        meta = tomllib.loads(manifest.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{manifest}: invalid TOML: {exc}") from exc
    for key, kind in MANIFEST_KEYS.items():
        if key not in meta:
            raise TaskError(f"{manifest}: missing key {key!r}")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise TaskError(f"{manifest}: key {key!r} has the wrong type ({type(meta[key]).__name__})")
    if meta["name"] != path.name:
        raise TaskError(f"{manifest}: name {meta['name']!r} differs from the folder name {path.name!r}")
    if meta["split"] not in SPLITS:
        raise TaskError(f"{manifest}: split must be one of {SPLITS}, not {meta['split']!r}")
    if meta["timeout"] <= 0 or not meta["issue"].strip():
        raise TaskError(f"{manifest}: timeout must be positive and issue non-empty")
    repo = path / "repo"
    if not repo.is_dir():
        raise TaskError(f"{path}: no repo/ folder")
    if not any(repo.glob("tests/test_*.py")) and not any(repo.glob("test_*.py")):
        raise TaskError(f"{repo}: no tests (expected tests/test_*.py or test_*.py)")
    return Task(name=meta["name"], path=path, repo=repo, issue=meta["issue"].strip(),
                split=meta["split"], bug=meta["bug"], timeout=float(meta["timeout"]))


def list_tasks(split: str | None = None) -> list[Task]:
    """All tasks under TASKS_DIR, sorted by name, optionally only those of one split."""
    if split is not None and split not in SPLITS:
        raise TaskError(f"unknown split {split!r}; expected one of {SPLITS}")
    tasks = [load_task(name) for name in _known_names()]
    return [t for t in tasks if split is None or t.split == split]
