"""What a drafter learned, kept in a file across a server's runs (`agentspec serve`).

`full` learns online from the model it serves: how often that model takes each kind of
draft (the acceptance model, with its token offsets and sent ratios), what its decode steps
cost on this machine, and the outputs it wrote (G). A bench gets the first from serving the
profiling split (`Policy.serve_recorded`); a server that restarts would lose all of it and
learn it again from its first requests. So a server saves its drafter's `state()` now and
then and when it stops, and a new run with the same file takes it back.

The file (format agentspec.state/4, docs/formats/state.md) is a numpy .npz archive, no
pickled objects: "header", a JSON text naming the format, the method, the model and a
digest of the tokenizer's vocabulary, then the drafter's named arrays. Token ids mean
nothing under another vocabulary, and kinds and tables are a method's own, so a state of
another tokenizer or method is refused (the file is left as it is); one learned while
serving another model of the same tokenizer is taken, with a warning: its acceptances are
that model's until the served one's replace them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import tempfile
import threading
import zipfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np

from agentspec.drafter import Drafter

log = logging.getLogger("agentspec.state")

FORMAT = "agentspec.state/4"
SAVE_EVERY = 16  # finished requests between two saves of a server's drafter state


class StateError(ValueError):
    """A state file that cannot be taken back: one line naming the file and the problem."""


@dataclass(frozen=True)
class Identity:
    """What a state is only good for."""

    method: str
    model: str
    tokenizer: str  # vocabulary_digest of the tokenizer


def vocabulary_digest(token_bytes: Sequence[bytes]) -> str:
    """A digest of a tokenizer's vocabulary: every id's bytes, in order."""
    h = hashlib.sha1()
    for b in token_bytes:
        h.update(len(b).to_bytes(4, "little") + b)
    return h.hexdigest()[:16]


def state_path(backend: str, model: str | None, dtype: str, method: str) -> Path:
    """Where a server keeps its drafter's state by default: per backend, model, dtype and
    method, beside the cost profiles."""
    from agentspec.costs import model_key
    from agentspec.models import home

    return home() / "state" / f"{backend}-{model_key(model)}-{dtype}-{method}.npz"


class Keeper:
    """Keeps a serving drafter's state in its file: takes it back at start, then saves it
    after every SAVE_EVERY finished requests, whenever the server falls idle (vLLM ends its
    drafter's process with SIGKILL: nothing runs at its exit) and when the server stops.
    A save takes a snapshot on the serving thread (`Drafter.state()` returns copies: a few
    ms) and writes it on a thread of its own, so no request waits for the disk; a newer
    snapshot replaces one not written yet."""

    def __init__(self, path: str | Path, drafter: Drafter, identity: Identity):
        self.path, self.drafter, self.identity = Path(path), drafter, identity
        self.unsaved = 0  # requests finished since the last snapshot
        self.failed = False  # the last write failed (and said so in the log)
        self._lock = threading.Lock()
        self._pending: dict | None = None  # the snapshot waiting for the writer
        self._writer: threading.Thread | None = None  # while it has snapshots to write

    def start(self) -> tuple[str | None, list[str]]:
        """Take back the file's state, if there is a file, and write it once now, so that a
        path that cannot be written fails at start (both raise StateError). Returns when
        the state taken back was saved (None: there was none) and warnings."""
        saved, warnings = restore(self.path, self.drafter, self.identity) \
            if self.path.exists() else (None, [])
        for stale in self.path.parent.glob(glob.escape(self.path.name) + ".*.tmp"):
            stale.unlink(missing_ok=True)  # (a write the process was killed in)
        _write(self.path, self.drafter.state(), self.identity)
        return saved, warnings

    def finished(self, idle: bool) -> None:
        """A request finished; `idle`: no other request is running."""
        self.unsaved += 1
        if self.unsaved >= SAVE_EVERY or idle:
            self.save()

    def save(self) -> None:
        """Snapshot the drafter's state now; the writer thread writes it."""
        snapshot = self.drafter.state()
        self.unsaved = 0
        with self._lock:
            self._pending = snapshot
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_pending, daemon=True,
                                                name="agentspec-state")
                self._writer.start()

    def close(self) -> bool:
        """Save now and wait until it is written; whether it was."""
        self.save()
        self.wait()
        return not self.failed

    def wait(self) -> None:
        """Until every snapshot taken is written."""
        with self._lock:
            writer = self._writer
        if writer is not None:
            writer.join(timeout=120)

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                snapshot, self._pending = self._pending, None
                if snapshot is None:
                    self._writer = None
                    return
            try:
                _write(self.path, snapshot, self.identity)
                self.failed = False
            except StateError as e:  # the last file stays; serving goes on
                log.error("agentspec: %s", e)
                self.failed = True


def save(path: str | Path, drafter: Drafter, identity: Identity) -> bool:
    """Write the drafter's state to `path` (all of it or nothing: a new file renamed over
    the old one). False: the drafter keeps no state, and nothing was written. Raises
    StateError where the file cannot be written."""
    arrays = drafter.state()
    if not arrays:
        return False
    _write(Path(path), arrays, identity)
    return True


def _write(path: Path, arrays: dict[str, np.ndarray], identity: Identity) -> None:
    header = {"format": FORMAT, **asdict(identity),
              "saved": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:  # (compressed: most token offsets are still 0)
            np.savez_compressed(f, header=np.array(json.dumps(header)), **arrays)
        os.replace(tmp, path)
    except OSError as e:
        raise StateError(f"state {path}: cannot write it ({e.strerror or e})") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def restore(path: str | Path, drafter: Drafter, identity: Identity) -> tuple[str, list[str]]:
    """Give the drafter back the state saved in `path`; returns when it was saved, and
    warnings (one line each).
    Raises StateError, naming the file and the problem, where it cannot (the file is left
    as it was; the drafter may hold part of it, so a server does not start)."""
    arrays = _read(Path(path), identity)
    header = json.loads(str(arrays.pop("header")))
    try:
        drafter.restore(arrays)
    except (KeyError, ValueError) as e:
        missing = f"no array {e}" if isinstance(e, KeyError) else str(e)
        raise StateError(f"state {path}: {missing}") from None
    warnings = [] if header["model"] == identity.model else [
        f"state {path} was learned serving {header['model']}, not {identity.model}: its "
        "acceptances are relearned from this model's"]
    return str(header.get("saved", "at an unknown time")), warnings


def check(path: str | Path, identity: Identity) -> None:
    """Raise StateError, as `restore` would, where the file at `path` could not be taken
    back; no file is fine (a first run makes it)."""
    if Path(path).exists():
        _read(Path(path), identity)


def _read(path: Path, identity: Identity) -> dict[str, np.ndarray]:
    """The file's arrays, its header checked against `identity`."""
    try:
        with path.open("rb") as f:
            archive = f.read(4) == b"PK\x03\x04"  # (np.load would try anything else as a pickle)
    except OSError as e:
        raise StateError(f"state {path}: cannot read it ({e.strerror or e})") from None
    if not archive:
        raise StateError(f"state {path}: not a readable state file (not the .npz archive "
                         "agentspec writes)")
    try:
        with np.load(path, allow_pickle=False) as loaded:
            arrays = {name: loaded[name] for name in loaded.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise StateError(f"state {path}: not a readable state file ({e})") from None
    try:
        header = json.loads(str(arrays["header"]))
        fmt, model = header["format"], header["model"]
        if not isinstance(model, str):
            raise TypeError("its model is not a name")
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"state {path}: no valid header ({type(e).__name__}: {e})") from None
    if fmt != FORMAT:
        raise StateError(f"state {path}: format {fmt!r}, not {FORMAT!r} (pass another "
                         "--state, or --no-state; an older agentspec's file cannot be read)")
    for field, what in (("method", "method"), ("tokenizer", "tokenizer vocabulary")):
        if header.get(field) != getattr(identity, field):
            raise StateError(f"state {path}: learned with {what} {header.get(field)!r}, not "
                             f"{getattr(identity, field)!r} (pass another --state, or "
                             "--no-state)")
    return arrays
