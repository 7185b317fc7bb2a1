"""Spending a batch's draft budget where acceptance is likely.

Two allocators over the same per-request candidates:
- `agentspec_lengths`: AgentSpec's Algorithm 2 as written (redundancy score g = c/n * p(n),
  budget floor(alpha / bz), L_i = max(|CT*_i|, B_t * g_i / sum g)).
- `AcceptanceModel`: ours. It keeps, per role and draft source (for the policy: the corpus and
  whether the match's occurrences agree), the online hazard that a copy of length L
  continues, turns it into the probability p_k that the k-th draft token is accepted, and
  drafts the length n that maximizes p_1 + ... + p_n - R * C(n). C(n) is what
  verifying n draft tokens per row costs at this batch size, in plain decode steps (read
  off the measured cost profile, shared/spec/cost-profile.md, or lambda * n); R is the
  running speedup, so R * C(n) is what that time would have produced at the current rate
  (with `calibrate_sent`, times how optimistic the model was about the drafts it sent).
  With linear costs this drafts token k while p_k >= lambda(b) * R.
"""

from __future__ import annotations

import math
import os
from typing import Sequence, Union

import numpy as np

from agentspec.speculation import accepted_prefix

# numba kernels for AcceptanceModel's hot paths (agentspec/_accept_nb.py) when numba imports, as
# agentspec.match decides; AGENTSPEC_NO_NUMBA=1 keeps the numpy code, their reference
_nb = None
if os.environ.get("AGENTSPEC_NO_NUMBA", "") != "1":
    try:
        from agentspec import _accept_nb as _nb
    except Exception:  # not installed, or unusable here: numpy it is
        _nb = None


def redundancy(c: int, n: int, g_min: float) -> float:
    """g(c, n) = c/n * p(n), p(n) = g_min + (1 - g_min)(1 - exp(1 - n))."""
    if n <= 0:
        return 0.0
    return c / n * (g_min + (1.0 - g_min) * (1.0 - math.exp(1 - n)))


def agentspec_lengths(cands: Sequence[tuple[int, int, int] | None], alpha: float,
                      g_min: float) -> list[int]:
    """Algorithm 2. `cands[i]` = (n, c, |CT*|) of request i, or None without candidates."""
    bz = len(cands)
    budget = math.floor(alpha / bz) if bz else 0
    g = [redundancy(c[1], c[0], g_min) if c else 0.0 for c in cands]
    total = sum(g)
    return [0 if c is None else max(c[2], int(budget * gi / total) if total > 0 else 0)
            for c, gi in zip(cands, g)]


COPY_BINS = 64
SENT_PRIOR = 20.0  # pseudo-tokens behind a sent ratio before its first drafts
DECAY = 0.999  # what R's sums and the sent ratios' keep of their past at each row verified
# the end of a sent ratio's key that prices a step where nothing paid at R (see planning_rate)
QUIET = "/quiet"


def copy_bin(length: int) -> int:
    """Bin of a copy length L >= 1: one per length up to 32, then four per doubling (a
    followed copy keeps growing past the longest match: up to ~2**12 tokens get bins)."""
    if length <= 32:
        return max(length, 1) - 1
    return min(COPY_BINS - 1, 32 + int(4 * math.log2(length / 32)))


# copy_bin of every length up to where the bins end (the hot path indexes this)
_BIN_OF = np.array([copy_bin(n) for n in range(8192)])


def copy_bins(lengths: np.ndarray) -> np.ndarray:
    return _BIN_OF[np.minimum(lengths, len(_BIN_OF) - 1)]


def hazard_counts(runs: Sequence[tuple[int, int]], max_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(trials, hits) per copy-length bin from (match length m, R) pairs, where R is how far
    a max_k-token draft after a match of length m matched: the j-th draft token continues a
    copy of length m + j, and it was reached when j <= R and accepted when j < R."""
    trials, hits = np.zeros(COPY_BINS), np.zeros(COPY_BINS)
    for m, r in runs:
        for j in range(min(r + 1, max_k)):
            b = copy_bin(m + j)
            trials[b] += 1
            hits[b] += j < r
    return trials, hits


# what one observation at a copy length adds to its bin and to the two on either side:
# copies of nearly the same length break alike, and one bin per length learns slowly alone
_SPREAD = np.array([0.25, 0.5, 1.0, 0.5, 0.25])
_OFFSETS = np.arange(-2, 3)
# AcceptanceModel's tables keep two empty bins on each side of a row, so an observation spreads
# without bounds checks (what lands there is never read)
_PAD = 2
_WIDTH = COPY_BINS + 2 * _PAD
_SPREAD_ROWS = np.tile(_SPREAD, (257, 1))  # one row per draft position


def spread(counts: np.ndarray) -> np.ndarray:
    """Counts per bin (the prior's) spread as `AcceptanceModel.observe` spreads observations."""
    return np.convolve(counts, _SPREAD, mode="same")


# Beside its kind (where a draft comes from) and copy length, what is known of each draft
# token's row: what kind of token it is (mid-word, new word, newline, punctuation), and
# whether the step's other candidate says the same (`agreement`). A draft token's row is
# kind * MODIFIERS + agreement * TOKEN_CLASSES + token class; a kind spans a power of two of
# rows, so the kernels find a row's kind by a shift, not a division: the hazard of every
# draft token reads it.
TOKEN_CLASSES = 4
ALONE, AGREES, DIFFERS = 0, 1, 2  # agreement with the other candidate (see `agreement`)
KIND_SHIFT = 4
MODIFIERS = 1 << KIND_SHIFT  # (3 agreements x 4 token classes of 16 rows a kind)

Kinds = Union[str, np.ndarray]  # one kind for a whole draft, or each token's row

# What no row knows: the draft tokens themselves. Which words the served model writes as the
# corpora do, and after which words, is content: each draft token's hazard also takes a
# logit offset, the sum of one per token id, one per id of the token before it, one per pair
# of the two and one per token id within its draft kind (hashed; a copy's token and a path's
# of the same id are taken differently), learned online by a step toward every scored
# position's outcome. (On the recorded traces they cut the log loss of first-token
# predictions by ~13%.) Each offset's step shrinks with the squared errors it has taken
# (AdaGrad's per-coordinate rate): a common token's offset settles, a rare one's still moves
# fast.
BIAS_BITS = 17  # entries of each offset table (ids past it share entries)
BIAS_RATE = 0.6  # an offset's step: BIAS_RATE * error / sqrt(1 + its squared errors so far)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: pairs spread over the table's entries
NO_IDS = np.zeros(0, dtype=np.int64)  # a draft without its tokens: no offsets

# Where a step's two candidates (a copy and a frequency path) say the same token, it is one
# event with two predictions. Its hazard is their blend, sigmoid(w0 + w1 * logit(copy's) +
# w2 * logit(path's)), the weights learned per role by online logistic regression over
# the positions the two agreed on (AdaGrad steps, as the offsets'). Each alone is a noisy
# estimate, and the plan, sending the candidate that looks best, took the higher one: on
# SWE-agent's agreed positions (32 sessions, seed 7) the higher of the two predicted
# 0.605 where 0.515 were taken; the blend, learned in order, cut their log loss from 0.419
# (either alone 0.425) to 0.409, its weights settling near (0.05, 0.47, 0.49).
BLEND_START = (0.0, 0.5, 0.5)  # the logits' mean, before anything is learned
BLEND_RATE = 0.03
NO_HAZARDS = np.zeros(0)  # a candidate no other agrees with: every hazard its own


def draft_ids(before: int, tokens: Sequence[int]) -> np.ndarray:
    """What the offsets of a draft are read with: the token before it, then its tokens."""
    return np.array([before, *tokens], dtype=np.int64)


def token_keys(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(4, n): where the logit offsets of draft tokens ids[1:] (`draft_ids`), of rows `rows`,
    lie in AcceptanceModel.bias: each token's id, the id before it, the pair, and the id
    with its kind."""
    u = ids.astype(np.uint64)
    before, token = u[:-1], u[1:]
    kind = (np.asarray(rows) >> KIND_SHIFT).astype(np.uint64)
    mask = np.uint64((1 << BIAS_BITS) - 1)
    return np.stack([token & mask, (before & mask) + np.uint64(1 << BIAS_BITS),
                     _hashed(before, token) + np.uint64(2 << BIAS_BITS),
                     _hashed(kind, token) + np.uint64(3 << BIAS_BITS)]).astype(np.intp)


def _hashed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairs (a, b) spread over an offset table's entries."""
    return ((a << np.uint64(20)) + b) * _MIX >> np.uint64(64 - BIAS_BITS)


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


def blended(weights: np.ndarray, copy_hazard: float, path_hazard: float) -> float:
    """The hazard of a token both candidates say (see BLEND_START), by the role's weights."""
    z = weights[0] + weights[1] * logit(copy_hazard) + weights[2] * logit(path_hazard)
    return 1.0 / (1.0 + math.exp(-z))


def with_offset(hazard: float, z: float) -> float:
    """A hazard moved by a logit offset z (0: unchanged)."""
    if z == 0.0:
        return hazard
    hazard = min(max(hazard, 1e-6), 1.0 - 1e-6)
    return 1.0 / (1.0 + (1.0 - hazard) / hazard * math.exp(-z))


def token_classes(token_bytes: Sequence[bytes]) -> np.ndarray:
    """Per token id: 0 inside a word (or empty), 1 starts a word, 2 holds a newline,
    3 punctuation. Whether a copy goes on is decided mostly at word boundaries."""
    def cls(b: bytes) -> int:
        if not b or b[:1].isalnum():
            return 0
        if b"\n" in b:
            return 2
        return 1 if b[:1] in (b" ", b"\t") else 3

    return np.array([cls(b) for b in token_bytes], dtype=np.intp)


def token_rows(kinds: int | np.ndarray, tokens: Sequence[int], classes: np.ndarray
               ) -> np.ndarray:
    """Each draft token's row: its kind (one for all, or each token's) plus its token class
    (`token_classes`; ids past the table take its last class; an empty table: none)."""
    if not len(classes):
        return np.zeros(len(tokens), dtype=np.int64) + kinds
    return kinds + classes.take(tokens, mode="clip")


def parted(tokens: Sequence[int], other: Sequence[int]) -> int:
    """How many first tokens two drafts both say."""
    n = min(len(tokens), len(other))
    return next((j for j in range(n) if tokens[j] != other[j]), n)


def agreement(tokens: Sequence[int], other: Sequence[int]) -> np.ndarray:
    """Per draft token, what the step's other candidate says of it: AGREES while the other
    has the same tokens up to it, DIFFERS from the first token on which they part, ALONE past
    the other's end (or with no other). A copy and a frequency path that agree are both
    taken more often than either alone predicts, and each less where they part (SWE-agent,
    first tokens predicted 0.20-0.28: taken 0.30-0.35 of the time in agreement, 0.14-0.24
    apart), which no row saw before."""
    n, both = min(len(tokens), len(other)), parted(tokens, other)
    said = np.full(len(tokens), ALONE, dtype=np.int64)
    said[:both] = AGREES
    if both < n:
        said[both:] = DIFFERS
    return said


class AcceptanceModel:
    """Online acceptance model: per role and draft token row (kind and modifiers, see
    MODIFIERS), the hazard h(L) that a draft token continuing a context of L matched tokens
    is accepted too, from counts per copy-length bin. A draft of n tokens after a match of
    length m is accepted up to its k-th token with probability h(m) h(m+1) ... h(m+k-1):
    fresh matches and followed copies share one curve, so what the model learns at any
    length serves every draft that reaches it.

    Each count is spread over its neighbouring bins (`spread`), and counts are pooled in
    three levels: a role's curve over all rows starts from the Kmax profile's prior
    (replayed traces, often another model's outputs) and learns from every draft; a draft
    kind's curve (all of its rows: every token class) is shrunk toward it, and a row's own
    counts toward its kind's, each with `source_weight` pseudo-trials. So a row seen rarely
    starts from what its kind does (a kind pools several rows, so it learns that many times
    faster: past outputs of another model, say, that the served model never takes), a rare
    kind from what the model does elsewhere, not from the traces' prior, and a
    well-observed row stands on its own counts."""

    def __init__(self, max_k: int = 64,
                 prior: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                 prior_weight: float = 16.0, source_weight: float = 8.0,
                 window: float = 2000.0, calibrate_sent: bool = False):
        self.max_k = max_k
        self.prior = prior or {}
        self.prior_weight = prior_weight
        self.source_weight = source_weight
        self.window = window  # a bin's counts are halved past this many trials: follows drift
        # (trials, hits) per copy-length bin: per role over every row, prior included, and
        # per role as flat (kind x bin) and (row x bin) tables, observations only
        self.pool: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.kinds: dict[str, int] = {}  # draft kind -> its index (rows index * MODIFIERS on)
        self.by_kind: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.by_row: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._args: dict[str, tuple] = {}  # per role: (kinds then, the kernels' tables)
        self.rate_sums = np.ones(2)  # decayed (tokens, cost) behind the running speedup R
        # sent_ratio of each key, as every plan reads it: key -> slot in ratios (1 where
        # nothing was sent yet) and in sent_sums (decayed predicted and accepted tokens),
        # and the slots of each tuple of keys (ratio_slots)
        self._slot: dict[str, int] = {}
        self.ratios = np.ones(8)
        self.sent_sums = np.full((8, 2), SENT_PRIOR)
        self._slots: dict[tuple[str, ...], np.ndarray] = {}
        # the draft tokens' logit offsets (token_keys), and each one's squared errors so far
        self.bias = np.zeros((2, 4 << BIAS_BITS))
        # per role, the blend of two candidates' predictions where they agree (BLEND_START):
        # its weights, and each weight's squared gradients so far
        self.blends: dict[str, np.ndarray] = {}
        self.calibrate_sent = calibrate_sent

    @property
    def rate(self) -> float:
        """R: tokens per plain decode step of cost, recently, and never below 1: drafting
        nothing already makes 1, so a worse recent rate must not make drafts look cheaper
        (which would lengthen the very drafts that brought it down)."""
        return max(1.0, float(self.rate_sums[0] / self.rate_sums[1]))

    def sent_ratio(self, key: str) -> float:
        """Predicted over accepted tokens of the drafts sent under `key` (the policy's: a
        role and the kind of decision), recently (1 unless `calibrate_sent`). Sending the
        candidate and length that look best favours estimates that came out high, a
        winner's curse: on SWE-agent, sent drafts took 0.90 of the tokens predicted, the
        candidates passed over 1.18. Plans price a draft token that much dearer (kept
        within [0.5, 2]: a bad stretch must not stop drafting for good)."""
        slot = self._slot.get(key)
        return 1.0 if slot is None else float(self.ratios[slot])

    def observe_sent(self, key: str, predicted: float, accepted: int) -> None:
        """A draft sent under `key`, `predicted` tokens expected, took `accepted`."""
        if self.calibrate_sent:
            slot = self._slot.get(key)
            if slot is None:
                slot = self.ratio_slots((key,))[0]
            sums = self.sent_sums[slot]
            sums[0] = sums[0] * DECAY + predicted
            sums[1] = sums[1] * DECAY + accepted
            self._set_ratio(slot)

    def _set_ratio(self, slot: int) -> None:
        """The sent ratio at `slot` from its sums (`_policy_nb._learn` sets it alike)."""
        predicted, accepted = self.sent_sums[slot]
        self.ratios[slot] = min(2.0, max(0.5, predicted / accepted))

    def planning_rate(self, key: str) -> float:
        """What a plan prices a step's worth at, in tokens: R, times the sent ratio. A quiet
        key's (`QUIET`) is 1 times its own: the rate of the step it prices, one where no
        draft paid at R, which without a draft makes 1 token (docs/drafting.md, "Where
        nothing pays")."""
        return (1.0 if key.endswith(QUIET) else self.rate) * self.sent_ratio(key)

    def charge(self, cost: float, accepted: int) -> None:
        """One verified row: it cost 1 + `cost` steps and produced accepted + 1 tokens."""
        sums = self.rate_sums
        sums[0] = sums[0] * DECAY + accepted + 1
        sums[1] = sums[1] * DECAY + 1 + cost

    # --- what it learned, kept across runs (agentspec.state) ------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Everything it learned, as named arrays (`restore` takes them back): the kinds in
        the order of their rows, each role's tables and blend, the token offsets, R's sums
        and the sent ratios' sums."""
        roles = sorted(self.pool.keys() | self.by_kind.keys() | self.by_row.keys()
                       | self.blends.keys())
        state = {"kinds": np.array(list(self.kinds), dtype=str),
                 "roles": np.array(roles, dtype=str), "bias": self.bias.copy(),
                 "rate": self.rate_sums.copy(),
                 "sent_keys": np.array(list(self._slot), dtype=str),
                 "sent": self.sent_sums[: len(self._slot)].copy()}
        for i, role in enumerate(roles):
            for name, tables in (("pool", self.pool), ("kind", self.by_kind),
                                 ("row", self.by_row)):
                if role in tables:
                    state[f"{name}/{i}"] = np.stack(tables[role])
            if role in self.blends:
                state[f"blend/{i}"] = self.blends[role].copy()
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Take back what `state()` gave. The kinds this model already has (those its
        policy names when built) must be the first ones of the state's, in the same order:
        their rows are where the policy's tables point."""
        kinds = [str(k) for k in state["kinds"]]
        if kinds[: len(self.kinds)] != list(self.kinds):
            raise ValueError("its draft kinds are not this policy's (another method's state?)")
        bias = state["bias"]
        if bias.shape != self.bias.shape or not np.isfinite(bias).all():
            raise ValueError(f"token offsets of shape {bias.shape} (or not finite), "
                             f"not {self.bias.shape}")
        if (bias[1] < 0).any():
            raise ValueError("token offsets with negative squared errors")
        if state["rate"].shape != (2,) or not (state["rate"] > 0).all():
            raise ValueError("R's sums must be two positive numbers")
        sent = state["sent"]
        if sent.shape != (len(state["sent_keys"]), 2) or (sent <= 0).any():
            raise ValueError("sent ratios need a positive (predicted, accepted) pair per key")
        # (trials, hits) per bin: the pool's one curve, a curve per kind, per row
        per_kind = {"pool": None, "kind": _WIDTH, "row": MODIFIERS * _WIDTH}
        tables: dict[str, dict] = {name: {} for name in per_kind}
        blends = {}
        for i, role in enumerate(str(r) for r in state["roles"]):
            blend = state.get(f"blend/{i}")
            if blend is not None:
                if blend.shape != (2, 3) or not np.isfinite(blend).all() or (blend[1] < 0).any():
                    raise ValueError(f"the blend of role {role!r} is not 3 weights and their "
                                     f"squared gradients (shape {blend.shape})")
                blends[role] = blend.astype(np.float64)
            for name, unit in per_kind.items():
                t = state.get(f"{name}/{i}")
                if t is None:
                    continue
                ok = t.ndim == 2 and t.shape[0] == 2 and (
                    t.shape[1] == _WIDTH if unit is None
                    else t.shape[1] % unit == 0 and t.shape[1] // unit <= len(kinds))
                if not ok or not np.isfinite(t).all() or (t < 0).any():
                    raise ValueError(f"the {name} table of role {role!r} is not one of "
                                     f"(trials, hits) counts per bin (shape {t.shape})")
                tables[name][role] = (t[0].astype(np.float64), t[1].astype(np.float64))
        self.kinds = {k: i for i, k in enumerate(kinds)}
        self.pool, self.by_kind, self.by_row = tables["pool"], tables["kind"], tables["row"]
        self.blends = blends
        self._args.clear()
        self.bias = state["bias"].astype(np.float64)
        self.rate_sums[:] = state["rate"]
        for key, sums in zip((str(k) for k in state["sent_keys"]), sent):
            slot = self.ratio_slots((key,))[0]
            self.sent_sums[slot] = sums
            self._set_ratio(slot)

    def _pooled(self, role: str) -> tuple[np.ndarray, np.ndarray]:
        """The role's counts over every kind, starting from the profile's prior."""
        if role not in self.pool:
            hazard, weight = np.full(COPY_BINS, 0.8), np.full(COPY_BINS, 4.0)
            if role in self.prior:
                trials, hits = (np.asarray(a, dtype=np.float64) for a in self.prior[role])
                seen = trials > 0
                if seen.any():
                    # bins the profile never reached take the hazard of the nearest
                    # shorter one that it did (or the first), with little weight
                    idx = np.maximum.accumulate(np.where(seen, np.arange(COPY_BINS), -1))
                    idx[idx < 0] = int(np.argmax(seen))
                    hazard = hits[idx] / trials[idx]
                    weight = np.where(seen, np.minimum(trials, self.prior_weight), 2.0)
            self.pool[role] = (np.pad(spread(weight), _PAD), np.pad(spread(weight * hazard), _PAD))
        return self.pool[role]

    def kind(self, name: str) -> int:
        """The first row of a draft kind (its tokens alone, of class 0)."""
        if name not in self.kinds:
            self.kinds[name] = len(self.kinds)
        return self.kinds[name] * MODIFIERS

    def _tables(self, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The role's flat (trials, hits) per row and bin, then per kind and bin, grown to
        every known kind."""
        return (*self._grown(self.by_row, role, len(self.kinds) * MODIFIERS * _WIDTH),
                *self._grown(self.by_kind, role, len(self.kinds) * _WIDTH))

    @staticmethod
    def _grown(tables: dict, role: str, size: int) -> tuple[np.ndarray, np.ndarray]:
        t, h = tables.get(role, (np.zeros(0),) * 2)
        if len(t) < size:
            t, h = (np.concatenate([a, np.zeros(size - len(a))]) for a in (t, h))
            tables[role] = (t, h)
        return t, h

    def _rows(self, kinds: Kinds, n: int) -> np.ndarray:
        return np.full(n, self.kind(kinds)) if isinstance(kinds, str) else kinds[:n]

    def _cells(self, m: int, kinds: Kinds, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where draft positions 1..n after a match of length m are counted: (index into
        the role's row table, into its kind table, into its pooled curve)."""
        at = copy_bins(m + np.arange(n)) + _PAD
        rows = self._rows(kinds, n)
        return rows * _WIDTH + at, rows // MODIFIERS * _WIDTH + at, at

    def _kernel_args(self, role: str) -> tuple:
        """The role's tables as the kernels read them (after every kind they index exists:
        the kernels do not check bounds), kept until a new kind grows them."""
        return self._kernel_state(role)[1]

    def kernel_tables(self, role: str) -> tuple:
        """What the planning kernel `_accept_nb.best_length` reads of the role's model, in its
        order, before the draft's rows (for a kernel that plans drafts itself: make every
        kind its rows use first), then what a kernel that also learns from a step reads
        (`_policy_nb.plan_request`): the spread of a count, the window, the offsets' step,
        whether sent ratios are learned, R's sums and the role's blend (`blend`) with its
        step."""
        return self._kernel_state(role)[2]

    def _kernel_state(self, role: str) -> tuple:
        """(kinds then, `_kernel_args`, `kernel_tables`) of the role, kept until a new kind
        grows the tables."""
        state = self._args.get(role)
        if state is None or state[0] != len(self.kinds):
            tables = (*self._tables(role), *self._pooled(role))
            state = self._args[role] = (len(self.kinds), tables, (
                *tables, _BIN_OF, _WIDTH, _PAD, KIND_SHIFT, self.source_weight, self.bias,
                BIAS_BITS, _SPREAD, self.window, BIAS_RATE, self.calibrate_sent,
                self.rate_sums, self.blend(role), BLEND_RATE))
        return state

    def blend(self, role: str) -> np.ndarray:
        """The role's blend (see BLEND_START): its weights, then their squared gradients."""
        blend = self.blends.get(role)
        if blend is None:
            blend = self.blends[role] = np.array([BLEND_START, (0.0, 0.0, 0.0)])
        return blend

    def agreed_hazards(self, role: str, copy: tuple, path: tuple, n: int) -> np.ndarray:
        """The hazards of the first n tokens, which a copy and a frequency path (each as
        (m, rows, ids)) both say: the role's blend of the two predictions."""
        if n <= 0:
            return NO_HAZARDS
        weights = self.blend(role)[0]
        return np.array([blended(weights, c, p) for c, p in
                         zip(self._hazards(role, *_drafted(copy, n)),
                             self._hazards(role, *_drafted(path, n)))])

    def learn_blend(self, role: str, copy: tuple, path: tuple, n: int, matched: int) -> None:
        """Step the role's blend toward what the target wrote at the first n tokens a copy
        and a path both said (each (m, rows, ids)), of which the first `matched` were
        right: each reached position, in order, with the hazards before this step."""
        reached = min(n, matched + 1)
        if reached <= 0:
            return
        blend = self.blend(role)
        copy_hazards = self._hazards(role, *_drafted(copy, reached))
        path_hazards = self._hazards(role, *_drafted(path, reached))
        for j in range(reached):
            x = np.array([1.0, logit(copy_hazards[j]), logit(path_hazards[j])])
            error = (1.0 if j < matched else 0.0) - blended(blend[0], copy_hazards[j],
                                                             path_hazards[j])
            for w in range(3):
                blend[1, w] += (error * x[w]) ** 2
                blend[0, w] += BLEND_RATE * error * x[w] / math.sqrt(1.0 + blend[1, w])

    def ratio_slots(self, keys: tuple[str, ...]) -> np.ndarray:
        """Where the sent ratio of each key lies in `ratios` (for a kernel that plans drafts
        itself: read `ratios` after this, which may grow it)."""
        slots = self._slots.get(keys)
        if slots is None:
            for key in keys:
                if key not in self._slot:
                    self._slot[key] = len(self._slot)
            if len(self._slot) > len(self.ratios):
                grow = len(self._slot)
                self.ratios = np.concatenate((self.ratios, np.ones(grow)))
                self.sent_sums = np.concatenate((self.sent_sums, np.full((grow, 2), SENT_PRIOR)))
            slots = self._slots[keys] = np.array([self._slot[key] for key in keys])
        return slots

    def accept_probs(self, role: str, m: int, source: Kinds = "", n: int | None = None,
                     ids: np.ndarray = NO_IDS, agreed: np.ndarray = NO_HAZARDS) -> np.ndarray:
        """P(draft token k is accepted), k = 1..n (default max_k, or every row given), after
        a match of length m; `source` is the draft's kind, or each token's row; `ids` its
        tokens (`draft_ids`), whose offsets move each hazard; `agreed` the hazards of its
        first tokens where another candidate said them too (`agreed_hazards`)."""
        n = (self.max_k if isinstance(source, str) else len(source)) if n is None else n
        hazards = self._hazards(role, m, source, n, ids)
        given = min(n, len(agreed))
        hazards[:given] = agreed[:given]
        return np.cumprod(hazards)

    def _hazards(self, role: str, m: int, source: Kinds, n: int,
                 ids: np.ndarray = NO_IDS) -> np.ndarray:
        """Each draft position's own hazard (accepted, once the tokens before it were)."""
        cells, kind_cells, at = self._cells(m, source, n)
        t, h, _, _ = self._tables(role)
        w = self.source_weight
        kind = self._kind_hazard(role, kind_cells, at)
        hazards = (h[cells] + w * kind) / (t[cells] + w)
        if len(ids):
            z = self.bias[0][token_keys(ids[: n + 1], self._rows(source, n))]
            hazards = np.array([with_offset(x, z[0, j] + z[1, j] + z[2, j] + z[3, j])
                                for j, x in enumerate(hazards)])
        return hazards

    def _kind_hazard(self, role: str, kind_cells: np.ndarray, at: np.ndarray) -> np.ndarray:
        """A kind's hazard at its cells (bins `at`): its counts shrunk toward the role's."""
        _, _, kt, kh = self._tables(role)
        pt, ph = self._pooled(role)
        w = self.source_weight
        return (kh[kind_cells] + w * ph[at] / pt[at]) / (kt[kind_cells] + w)

    def kind_hazards(self, role: str, kinds: np.ndarray, lengths: int) -> np.ndarray:
        """Per kind (its first row, as `kind` gives it) and copy length L < lengths: the
        hazard that a draft token of that kind continuing a copy of length L is accepted, by
        the kind's curve (every row of it pooled, as `accept_probs` shrinks a row toward)."""
        at = copy_bins(np.arange(lengths)) + _PAD
        cells = (np.asarray(kinds) // MODIFIERS)[:, None] * _WIDTH + at
        return self._kind_hazard(role, cells, at)

    def plan(self, role: str, m: int, kinds: Kinds, n: int, costs: np.ndarray,
             sent: str | None = None, ids: np.ndarray = NO_IDS,
             agreed: np.ndarray = NO_HAZARDS) -> tuple[int, float]:
        """(length, gain) of the best way to send at most n tokens of a draft after a match
        of length m (see `best_length`), priced by the sent ratio of `sent` (default: the
        role's)."""
        if m <= 0 or n <= 0:
            return 0, 0.0
        rate = self.planning_rate(role if sent is None else sent)
        if _nb is None:
            return best_length(self.accept_probs(role, m, kinds, n, ids, agreed), costs, rate)
        rows = self._rows(kinds, n)  # first: it may add a kind, which grows the tables
        return _nb.best_length(*self._kernel_args(role), rows, m, n, _BIN_OF, _WIDTH, _PAD,
                               KIND_SHIFT, self.source_weight, costs, rate, self.bias, ids,
                               BIAS_BITS, agreed)

    def length(self, role: str, m: int, cap: int, costs: np.ndarray, source: str = "") -> int:
        """The draft length n <= cap that gains most."""
        return self.plan(role, m, source, min(cap, self.max_k, len(costs) - 1), costs)[0]

    def expected(self, role: str, m: int, kinds: Kinds, n: int, ids: np.ndarray = NO_IDS,
                 agreed: np.ndarray = NO_HAZARDS) -> float:
        """Expected accepted tokens of the first n tokens of a draft."""
        if m <= 0 or n <= 0:
            return 0.0
        if _nb is None:  # summed in order
            return float(np.cumsum(self.accept_probs(role, m, kinds, n, ids, agreed))[-1])
        rows = self._rows(kinds, n)
        return _nb.expected(*self._kernel_args(role), rows, m, n, _BIN_OF, _WIDTH, _PAD,
                            KIND_SHIFT, self.source_weight, self.bias, ids, BIAS_BITS, agreed)

    def observe(self, role: str, m: int, known: int, matched: int, source: Kinds = "",
                ids: np.ndarray = NO_IDS) -> None:
        """Score a draft after a match of length m against the target: its tokens are known
        at the first `known` draft positions, and the first `matched` equal the draft's.
        Positions up to the first mismatch are trials. A draft is scored whether or not it
        was sent: the target's token after a fully accepted draft, or the tokens it wrote
        over a draft the policy passed over, teach positions no sent draft reached. With
        its tokens (`ids`), each reached position's offsets step toward its outcome first."""
        reached = min(matched + 1, known)
        if reached <= 0 or m <= 0:
            return
        if _nb is not None:
            rows = self._rows(source, reached)
            _nb.observe(*self._kernel_args(role), rows, m, reached, matched, _BIN_OF, _WIDTH,
                        _PAD, KIND_SHIFT, _SPREAD, self.window, self.source_weight, self.bias,
                        ids, BIAS_BITS, BIAS_RATE)
            return
        if len(ids):
            hazards = self._hazards(role, m, source, reached)
            keys = token_keys(ids[: reached + 1], self._rows(source, reached))
            for j in range(reached):  # in order: a later position sees the earlier's steps
                z = self.bias[0, keys[:, j]]
                p = with_offset(hazards[j], z[0] + z[1] + z[2] + z[3])
                error = (1.0 if j < matched else 0.0) - p
                for key in keys[:, j]:
                    self.bias[1, key] += error * error
                    self.bias[0, key] += BIAS_RATE * error / math.sqrt(1.0 + self.bias[1, key])
        cells, kind_cells, at = self._cells(m, source, reached)
        weight = _SPREAD_ROWS[:reached]  # each position adds _SPREAD around its bin
        weight_hit = weight.copy()
        weight_hit[matched:] = 0.0
        weight, weight_hit = weight.ravel(), weight_hit.ravel()
        rt, rh, kt, kh = self._tables(role)
        for (t, h), near in (((rt, rh), cells), ((kt, kh), kind_cells),
                             (self._pooled(role), at)):
            near = (near[:, None] + _OFFSETS).ravel()
            np.add.at(t, near, weight)
            np.add.at(h, near, weight_hit)
            if t[near].max() > self.window:  # halve full bins: the model follows drift
                full = near[t[near] > self.window]
                t[full] *= 0.5
                h[full] *= 0.5


def _drafted(draft: tuple, n: int) -> tuple:
    """`_hazards`' arguments for the first n tokens of a draft given as (m, rows, ids)."""
    m, rows, ids = draft
    return m, rows[:n], n, ids[: n + 1]


def best_length(p: np.ndarray, costs: np.ndarray, rate: float) -> tuple[int, float]:
    """(n, gain): the draft length that gains most, given P(token k accepted) = p[k-1]:
    expected accepted tokens minus what the n tokens cost (costs[n], in plain steps) times
    R, each step's worth in tokens. With linear costs lambda * n this drafts token k while
    p_k >= lambda * R."""
    n = min(len(p), len(costs) - 1)
    gain = np.concatenate(([0.0], np.cumsum(p[:n]))) - rate * np.asarray(costs[: n + 1])
    best = int(np.argmax(gain))
    return best, float(gain[best])


def scored(draft: Sequence[int], revealed: Sequence[int]) -> tuple[int, int]:
    """(known, matched) of a draft against the tokens the target wrote at its positions."""
    return min(len(draft), len(revealed)), accepted_prefix(draft, revealed)
