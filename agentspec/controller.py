"""How many tokens to draft: AgSpec's controller and the Kmax table it is capped by.

K = clip(round(alpha * m), 1, Kmax[role]), where m is the match length. alpha is kept per
role and updated after every verification: alpha += eta * (tau - [a draft token was
rejected]), tau = 1 - lambda, so alpha tracks the tau-quantile of accepted/matched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from agentspec.allocator import COPY_BINS
from agentspec.costs import read_format

ALPHA_MIN, ALPHA_MAX = 0.05, 12.0
DEFAULT_KMAX = 32
KMAX_FORMAT = "agentspec.kmax/1"


class KmaxError(ValueError):
    """A Kmax table that cannot be used; the message names the file and the problem."""


@dataclass
class Controller:
    lam: float
    kmax: dict[str, int] = field(default_factory=dict)
    default_kmax: int = DEFAULT_KMAX
    eta: float = 0.5
    alpha: dict[str, float] = field(default_factory=dict)

    @property
    def tau(self) -> float:
        return 1.0 - self.lam

    def cap(self, role: str) -> int:
        return self.kmax.get(role, self.default_kmax)

    def length(self, role: str, m: int) -> int:
        if m <= 0:
            return 0
        return max(1, min(round(self.alpha.get(role, 1.0) * m), self.cap(role)))

    def update(self, role: str, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted == self.cap(role):
            return  # fully accepted but cut by the cap: says nothing about alpha
        a = self.alpha.get(role, 1.0) + self.eta * (self.tau - (accepted < drafted))
        self.alpha[role] = min(ALPHA_MAX, max(ALPHA_MIN, a))


@dataclass
class KmaxTable:
    """Per-role Kmax from replayed traces: the largest k with Pr(R >= k) >= lambda."""

    lam: float
    kmax: dict[str, int]
    survival: dict[str, list[float]]  # Pr(R >= k) for k = 1..len
    samples: dict[str, int]
    source: dict = field(default_factory=dict)
    # (trials, hits) per role and copy-length bin (see allocator.copy_bin): the prior of the
    # cost-aware allocator's hazard
    hazard: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @classmethod
    def from_runs(cls, lam: float, runs: dict[str, list[tuple[int, int]]], max_k: int,
                  source: dict | None = None) -> "KmaxTable":
        """`runs[role]`: (match length m, R) of every step that had a retrieved continuation."""
        import numpy as np

        from agentspec.allocator import hazard_counts

        def surv(r: np.ndarray) -> list[float]:
            return [round(float(np.mean(r >= k)), 5) for k in range(1, max_k + 1)]

        kmax, survival, samples, hazard = {}, {}, {}, {}
        for role, pairs in sorted(runs.items()):
            arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            r = arr[:, 1]
            survival[role] = surv(r) if len(r) else [0.0] * max_k
            ok = [k for k, p in enumerate(survival[role], 1) if p >= lam]
            kmax[role] = max(ok) if ok else 1
            samples[role] = len(r)
            trials, hits = hazard_counts(arr.tolist(), max_k)
            hazard[role] = (trials.tolist(), hits.tolist())
        return cls(lam, kmax, survival, samples, source or {}, hazard)

    def to_json(self) -> dict:
        return {"format": KMAX_FORMAT, "lambda": self.lam, "kmax": self.kmax,
                "survival": self.survival, "samples": self.samples,
                "hazard_by_copy_length": {r: {"trials": t, "hits": h}
                                          for r, (t, h) in self.hazard.items()},
                **self.source}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def load_kmax(path: str | Path) -> KmaxTable:
    obj = read_format(path, KMAX_FORMAT, "Kmax table", KmaxError)

    def field_of(name: str, parse, holds: str, default=None):
        """obj[name] parsed; a missing or malformed field is named in the error."""
        if name not in obj:
            if default is None:
                raise KmaxError(f"{path}: bad Kmax table: no {name!r}")
            return default
        try:
            return parse(obj[name])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KmaxError(f"{path}: bad Kmax table: {name!r} must be {holds}") from None

    kmax = field_of("kmax", lambda v: {str(r): int(k) for r, k in v.items()},
                    "an object of role: integer")
    survival = field_of("survival", lambda v: {str(r): [float(p) for p in ps]
                                               for r, ps in v.items()},
                        "an object of role: list of numbers", {})
    hazard = field_of("hazard_by_copy_length",
                      lambda v: {str(r): ([float(x) for x in d["trials"]],
                                          [float(x) for x in d["hits"]]) for r, d in v.items()},
                      'an object of role: {"trials": [...], "hits": [...]}', {})
    samples = field_of("samples", lambda v: {str(r): int(n) for r, n in v.items()},
                       "an object of role: integer", {})
    lam = field_of("lambda", float, "a number")
    if any(k < 1 for k in kmax.values()):
        raise KmaxError(f"{path}: every Kmax must be >= 1")
    if any(len(t) != COPY_BINS or len(h) != COPY_BINS or any(x < y for x, y in zip(t, h))
           for t, h in hazard.values()):
        raise KmaxError(f"{path}: hazard_by_copy_length needs {COPY_BINS} trials and hits "
                        "per role, hits <= trials")
    return KmaxTable(lam, kmax, survival, samples, hazard=hazard)
