"""Cost profiles in the `agentspec.cost/1` format (shared/spec/cost-profile.md).

lambda(b) is the cost of verifying one more token, in units of the per-token cost of
plain decoding at batch size b; a draft token accepted with probability below lambda(b)
costs more than it saves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "agentspec.cost/1"


class CostProfileError(ValueError):
    """A cost profile file that cannot be used; the message names the file and the problem."""


def fit_lambda(batch: int, tokens_per_row: list[int], seconds: list[float]) -> float:
    """lambda(b) = slope / (t(b,1) / b), slope = d t / d (total tokens in the step)."""
    total = np.asarray(tokens_per_row, dtype=np.float64) * batch
    t = np.asarray(seconds, dtype=np.float64)
    slope = float(np.polyfit(total, t, 1)[0]) if len(t) > 1 else 0.0
    t1 = float(t[list(tokens_per_row).index(1)])
    return max(slope, 0.0) / (t1 / batch)


@dataclass
class BatchCost:
    tokens_per_row: list[int]
    seconds: list[float]
    lam: float


@dataclass
class CostProfile:
    backend: str
    model: str
    batches: dict[int, BatchCost]
    dtype: str = ""
    machine: str = ""
    created: str = ""
    context_tokens: int = 0
    extra: dict = field(default_factory=dict)

    def _interp(self, b: int, values: list[float]) -> float:
        sizes = sorted(self.batches)
        return float(np.interp(b, sizes, values))

    def step_time(self, b: int) -> float:
        """Seconds of one plain decode step for b rows."""
        sizes = sorted(self.batches)
        return self._interp(b, [self.batches[s].seconds[self.batches[s].tokens_per_row.index(1)]
                                for s in sizes])

    def lam(self, b: int) -> float:
        sizes = sorted(self.batches)
        return self._interp(b, [self.batches[s].lam for s in sizes])

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "backend": self.backend, "model": self.model, "dtype": self.dtype,
            "machine": self.machine, "created": self.created,
            "context_tokens": self.context_tokens,
            "batches": {str(b): {"tokens_per_row": c.tokens_per_row, "seconds": c.seconds,
                                 "lambda": c.lam}
                        for b, c in sorted(self.batches.items())},
            **self.extra,
        }

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def read_format(path: str | Path, fmt: str, what: str, error: type[ValueError]) -> dict:
    """Read a JSON object of format `fmt`; any problem raises `error` naming the file."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: not a readable JSON {what} ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise error(f"{path}: format is not {fmt!r}")
    return obj


def load_profile(path: str | Path) -> CostProfile:
    obj = read_format(path, FORMAT, "cost profile", CostProfileError)
    batches = {}
    try:
        for key, entry in obj["batches"].items():
            b = int(key)
            tokens = [int(x) for x in entry["tokens_per_row"]]
            secs = [float(x) for x in entry["seconds"]]
            lam = float(entry["lambda"])
            if b < 1 or len(tokens) != len(secs) or 1 not in tokens:
                raise ValueError(f"batch {key}: needs b >= 1, matching lists and a 1-token point")
            if not all(s > 0 and math.isfinite(s) for s in secs) or not math.isfinite(lam) or lam < 0:
                raise ValueError(f"batch {key}: seconds must be positive and lambda >= 0")
            batches[b] = BatchCost(tokens, secs, lam)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CostProfileError(f"{path}: bad 'batches' entry ({e})") from None
    if not batches:
        raise CostProfileError(f"{path}: no batch sizes measured")
    known = {"format", "backend", "model", "dtype", "machine", "created", "context_tokens",
             "batches"}
    return CostProfile(backend=str(obj.get("backend", "")), model=str(obj.get("model", "")),
                       batches=batches, dtype=str(obj.get("dtype", "")),
                       machine=str(obj.get("machine", "")), created=str(obj.get("created", "")),
                       context_tokens=int(obj.get("context_tokens", 0) or 0),
                       extra={k: v for k, v in obj.items() if k not in known})
