"""The agentspec drafter: what to draft (corpora, structure) and how much (controller, allocator).

One `Policy` class serves every rung of the method ladder; a `PolicyConfig` switches its
mechanisms on and names two small strategy objects, composed per rung by `ladder()`:
- corpora (AgSpec): S = this session's prompts, tool outputs and outputs (shared by all
  roles, including the running output; with `listings`, a file a tool showed as numbered
  lines also without its numbers); W = files the session opened, raw and (once an output
  writes a hunk) in the ' '- and '-'-prefixed diff emission forms; G = outputs of other
  sessions (with `lead`, an output's document in S and G starts with its prompt's last
  tokens, so an output's first tokens have a context too). How their
  matches compete (`choose`): `Longest` (AgSpec: S and W on match length, tie S; G only
  when longer by more than `delta`) or `MostExpected` (ours: by the acceptance model).
- structure isolation (AgentSpec): a pushdown automaton tracks the open block of each
  output; block history is kept per (session, agent, query, block type).
- how long (`length`): `Fixed`, `Alpha` (AgSpec's controller with per-role Kmax),
  `Algorithm2` (AgentSpec's) or `CostAware` (ours, with the switches below). Strategies
  are frozen parameters with the behaviour that uses them; the state they read and train
  (controller, acceptance model, corpora) is the Policy's.
- following (ours): while the output keeps copying the continuation last drafted from,
  keep reading it instead of searching again; a continuation that runs into the output
  being written (the output repeats itself) goes on repeating, as an overlapping copy does.
- frequency (ours, after SuffixDecoding): beside the best copy, the most frequent
  continuation of the last few tokens over all outputs or over this session's own text
  (each source's path, and the source, the one the acceptance model expects more accepted
  tokens of; read from G and S, whose index then starts at one-token contexts:
  `agentspec.frequency`, `match.frequent_candidate`; G then feeds this draft alone); each
  step drafts whichever of the two gains more under the cost model (a frequency path sent
  to its end, with the path after it where that gains more). Each draft token's
  curve knows what kind of token it is, and its words move it (learned offsets per token,
  per token before it, per pair and per token within its draft kind), and both candidates
  are scored against what the target wrote, drafted or not, so the choice is learned from
  the served model.
Sessions never see each other's S, W or block history.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

import numpy as np

from agentspec import allocator, match
from agentspec.allocator import (NO_HAZARDS, NO_IDS, QUIET, TOKEN_CLASSES, AcceptanceModel,
                                 agentspec_lengths, agreement, draft_ids, parted, scored,
                                 token_classes, token_rows)
from agentspec.controller import Controller, KmaxTable
from agentspec.costs import linear_costs
from agentspec.drafter import FILE, OUTPUT, PROMPT, Request
from agentspec.frequency import FREQUENCY_CLASSES, WORTH_EVERY
from agentspec.learned_costs import LearnedCosts
from agentspec.match import (MAX_CONTEXT, NO_MATCH, TAIL_MAX, ContextWindow, Corpus, Match,
                             context_ids, frequent_buffers, frequent_candidate, plan_reads,
                             search_constants)
from agentspec.replay import replay
from agentspec.structure import BlockTracker, StructureError, parse_structure, text_of
from agentspec.tokens import TokenizedSession

# the numba kernel of CostAware's plan (agentspec/_policy_nb.py) where numba imports, as
# agentspec.match decides; a Policy uses it where the corpora's and the acceptance model's
# kernels are in use too (see Policy.compiled)
_nb = None
if os.environ.get("AGENTSPEC_NO_NUMBA", "") != "1":
    try:
        from agentspec import _policy_nb as _nb
    except Exception:  # not installed, or unusable here: numpy it is
        _nb = None

EXTENSIONS = 2  # how many times a frequency path drafted to its end may be continued
_kernels_ready = False  # see warm_up
NO_ROWS = np.zeros(0, dtype=np.int64)  # (a frequency path that continues none)
NO_WORTH = np.zeros((0, 0, 0))  # (the compiled plan's path worth: none)
NO_AGE = np.zeros(0, dtype=np.int64)  # (... and none read)
# (the compiled plan's drafted, accepted, revealed: nothing to learn)
NOTHING_TO_LEARN = (-1, 0, np.zeros(0, dtype=np.int32))


def _check(strategy, field_: str, ok: bool, why: str) -> None:
    """A bad strategy value fails at construction, naming the strategy and the field."""
    if not ok:
        raise ValueError(f"{type(strategy).__name__}: {field_}={getattr(strategy, field_)!r} "
                         f"{why}")


# --- how long a draft each request gets ------------------------------------------------
@dataclass(frozen=True)
class Fixed:
    """Every match drafts its next `k` tokens."""

    k: int = 10

    def __post_init__(self) -> None:
        _check(self, "k", self.k >= 1, "must be at least 1")

    def drafts(self, policy: Policy, batch: Sequence[Request], matches: list[Match],
               padded: bool = False):
        return [m.tokens[:self.k] if m.length else [] for m in matches]

    def observe(self, policy: Policy, request: Request, drafted: int, accepted: int) -> None:
        pass


@dataclass(frozen=True)
class Alpha:
    """AgSpec: alpha * match length, capped per role by Kmax; alpha tracks the (1 - lambda)
    quantile of accepted / matched per role (the policy's `Controller`)."""

    def drafts(self, policy: Policy, batch: Sequence[Request], matches: list[Match],
               padded: bool = False):
        controller = policy.controller
        controller.lam = policy.lam_at(len(batch))
        return [m.tokens[:controller.length(r.role, m.length)] for r, m in zip(batch, matches)]

    def observe(self, policy: Policy, request: Request, drafted: int, accepted: int) -> None:
        policy.controller.update(request.role, drafted, accepted)


@dataclass(frozen=True)
class Algorithm2:
    """AgentSpec's Algorithm 2: a batch budget of floor(alpha / batch size) tokens, shared
    by each match's redundancy score (g_min: the score of a lone occurrence)."""

    alpha: float = 32.0
    g_min: float = 0.3

    def __post_init__(self) -> None:
        _check(self, "alpha", self.alpha > 0, "must be positive")
        _check(self, "g_min", 0.0 <= self.g_min <= 1.0, "must be within [0, 1]")

    def drafts(self, policy: Policy, batch: Sequence[Request], matches: list[Match],
               padded: bool = False):
        lengths = agentspec_lengths(
            [(m.candidates, m.agree, m.agreed) if m.length else None for m in matches],
            self.alpha, self.g_min)
        return [m.tokens[:k] for m, k in zip(matches, lengths)]

    def observe(self, policy: Policy, request: Request, drafted: int, accepted: int) -> None:
        pass


@dataclass(frozen=True)
class CostAware:
    """Ours: per request, the candidate and length that gain most, expected accepted tokens
    (the policy's `AcceptanceModel`) against what drafting them costs at this batch size.
    Its switches: a frequency-weighted candidate over outputs beside the copy (`frequency`;
    G then feeds it alone, see Policy), and over the session's own text too
    (`session_text`), each the path the acceptance model expects the most of
    (`learned_paths`; else SuffixDecoding's pick); each draft token's curve knowing what
    kind of token it is (`token_classes`); every candidate scored against what the target
    wrote, not only the draft sent (`score_all`); draft tokens priced by how much of its
    predictions the drafts sent actually took (`calibrate_sent`: the winner's curse of
    sending the best-looking one), and each draft token's hazard moved by what the tokens
    themselves say (`token_bias`: learned offsets per token, per token before it, per pair
    and per token within its draft kind); the frequency path sent, where it pays to its end,
    continued by the path after it (`extend`: up to EXTENSIONS times, each with curves and
    a sent ratio of its own); each draft token's row knowing whether the step's other
    candidate says the same (`agreement`); the tokens both candidates say taking the
    role's learned blend of their two predictions (`blend`); and where no candidate pays
    at R, both planned again at the rate of such a step, 1 token, times the sent ratio of
    the drafts so sent (`quiet`: the role's `QUIET` key). No Kmax cap: the acceptance
    model conditions on match length, which separates long copies from short matches
    better.

    On an engine that pads (`padded`), every row pays for the longest draft: each row
    keeps its best candidate, and one width is planned for the batch, the one whose
    expected accepted tokens over all rows gain most against its price. Rows whose
    drafts are shorter than the width draft up to it, at no extra cost."""

    frequency: bool = False
    session_text: bool = False
    learned_paths: bool = False
    token_classes: bool = False
    score_all: bool = False
    calibrate_sent: bool = False
    token_bias: bool = False
    extend: bool = False
    agreement: bool = False
    blend: bool = False
    quiet: bool = False

    def drafts(self, policy: Policy, batch: Sequence[Request], matches: list[Match],
               padded: bool = False):
        costs = policy.costs_at(len(batch))
        plan = self._plan_compiled if policy.compiled else self._plan
        drafts = [plan(policy, r, m, policy.running[r.id], costs, padded)
                  for r, m in zip(batch, matches)]
        if not padded:
            return drafts
        # every row pays for the widest: each drafts its best candidate up to one width
        steps = [policy.running[r.id].step() for r in batch]
        width = common_width(policy, batch, steps, costs)
        drafts = [sent.tokens[:width] if sent else [] for _, sent, _ in steps]
        widest = max(map(len, drafts), default=0)
        for r, (_, sent, _), draft in zip(batch, steps, drafts):
            expected = policy.acceptance.expected(r.role, sent.m, sent.rows, len(draft),
                                                  sent.ids, sent.agreed) if draft else 0.0
            policy.running[r.id].step_costs[:] = (expected, costs[widest])
        return drafts

    def _plan(self, policy: Policy, r: Request, m: Match, run: _Running, costs: np.ndarray,
              padded: bool) -> list[int]:
        """This step's candidates, and the draft that gains most (the numpy engine's;
        `_policy_nb.plan_request` is the same in one compiled call), kept as the compiled
        plan keeps them (`_Running.keep`)."""
        if run.pending is not None:
            self.learn(policy, run)
        candidates = self._candidates(policy, r, m, run)
        if self.agreement and len(candidates) == 2:
            candidates = agreed(*candidates)
        if self.blend and len(candidates) == 2:
            candidates = blended_pair(policy.acceptance, r.role, *candidates)
        # padded, a row's best candidate drafts even when it would not pay alone
        draft, gain, sent, key = [], -np.inf if padded else 0.0, None, ""
        for c in candidates:
            c_key = sent_key(r.role, c.frequency, len(candidates))
            n, c_gain = policy.acceptance.plan(r.role, c.m, c.rows, len(c.rows), costs, c_key,
                                               c.ids, c.agreed)
            if c_gain > gain:
                draft, gain, sent, key = c.tokens[:n], c_gain, c, c_key
        for depth in range(EXTENSIONS if self.extend else 0):
            # the frequency path sent pays to its end: the path after it too, if that
            # gains more (scored in its place either way)
            c = sent
            if c is None or not c.frequency or len(draft) != len(c.tokens) \
                    or len(draft) >= policy.config.max_k:
                break
            longer = self._extended(policy, r, c, depth)
            if longer is None:
                break
            candidates = [longer if x is c else x for x in candidates]
            n, c_gain = policy.acceptance.plan(r.role, longer.m, longer.rows,
                                               len(longer.rows), costs, key + "+", longer.ids,
                                               longer.agreed)
            if c_gain <= gain:
                break
            draft, gain, sent, key = longer.tokens[:n], c_gain, longer, key + "+"
        if self.quiet and sent is None and not padded:
            for c in candidates:  # (sent is None: no continuation was scored)
                n, c_gain = policy.acceptance.plan(r.role, c.m, c.rows, len(c.rows), costs,
                                                   r.role + QUIET, c.ids, c.agreed)
                if c_gain > gain:
                    draft, gain, sent, key = c.tokens[:n], c_gain, c, r.role + QUIET
        # the tokens it expects accepted: the gain plus what the draft was priced at
        expected = gain + policy.acceptance.planning_rate(key) * costs[len(draft)] \
            if draft else 0.0
        run.keep(candidates, sent, key, r.tokens[-1] if r.tokens else 0,
                 (expected, costs[len(draft)]))
        return draft

    def _plan_compiled(self, policy: Policy, r: Request, m: Match, run: _Running,
                       costs: np.ndarray, padded: bool) -> list[int]:
        """`_plan` as one kernel call (`_policy_nb.plan_request`), with the step's lookup in
        S where the policy left it to the plan (see `Policy.propose`)."""
        acceptance = policy.acceptance
        s = policy.sessions[r.session].s
        ids, rows, copy_ids, copy_rows, blended, found, found_tokens, _, slots, kept, \
            step_costs, _ = run.buffers
        # (the kernel reads the path worth anew where due, after it learned the step kept)
        worth, worth_age = policy.role_worth(r.role) \
            if self.frequency and policy.config.session and self.learned_paths \
            else (NO_WORTH, NO_AGE)
        drafted, accepted, revealed = NOTHING_TO_LEARN
        if run.pending is not None:  # (the plan learns it, from the buffers)
            _, drafted, accepted, revealed, written = run.pending
            run.pending = None
            # as ids: the context's last tokens, where nothing was written since
            revealed = run.context[len(run.context) - len(revealed):] \
                if written == len(r.tokens) and len(revealed) <= len(run.context) \
                else context_ids(revealed)
        before = r.tokens[-1] if r.tokens else 0  # the token the drafts follow
        copy_m, given_rows, given_ids = 0, NO_ROWS, NO_IDS
        if not run.looks_up:
            copy = self._copy(policy, r, m, run.source)
            if copy:  # (the plan reads the copy's tokens in its ids, offsets or not)
                copy_m, given_rows = copy.m, copy.rows
                given_ids = copy.ids if self.token_bias else draft_ids(before, copy.tokens)
        n, looked = _nb.plan_request(
            *plan_reads(s, policy.g, run.context, policy.config.max_k, run.looks_up),
            *policy.role_constants(r.role), worth, drafted, accepted, revealed, worth_age,
            costs, copy_m, given_rows, given_ids, before, acceptance.ratios,
            acceptance.sent_sums, slots, -np.inf if padded else 0.0, found, found_tokens, ids,
            rows, copy_ids, copy_rows, blended, kept, step_costs)
        if run.looks_up:  # what retrieval would have found: S's match, kept as the copy
            s.indexed_to(looked[6])
            copy_m, chosen, occurrences, agree, agreed = looked[:5]
            run.looked = (copy_m, occurrences, agree, agreed, s.position(chosen)) \
                if copy_m else None
            run.source = "S" + occurrences_agree(occurrences, agree) if copy_m else ""
        sent_copy = kept[4] == 0  # (see `_policy_nb.keep`)
        return (copy_ids if sent_copy else ids)[1 : n + 1].tolist() if n else []

    def _candidates(self, policy: Policy, r: Request, m: Match, run: _Running
                    ) -> list[Candidate]:
        """The best copy, and with `frequency` the most frequent continuation."""
        max_k = policy.config.max_k
        copy = self._copy(policy, r, m, run.source)
        found = [copy] if copy else []
        if self.frequency and policy.config.session:
            # one read a step: the path and its continuations are weighed alike
            run.worth = policy.path_worth(r.role) if self.learned_paths else None
            before = r.tokens[-1] if r.tokens else 0
            c = self._frequent(policy, r, run.context, max_k, 0,
                               np.array([before], dtype=np.int64), NO_ROWS)
            if c is not None:
                found.append(c)
        return found

    def _copy(self, policy: Policy, r: Request, m: Match, source: str) -> Candidate | None:
        """The match's continuation as a candidate (None: no match)."""
        if not m.length:
            return None
        kind = policy.acceptance.kind(source)
        c = self._candidate(policy, m.tokens[:policy.config.max_k], m.length, kind,
                            r.tokens[-1] if r.tokens else 0)
        if m.candidates > 1 and m.agreed < len(c.rows):  # (see draft_kind)
            c.rows[m.agreed:] += policy.acceptance.kind(source + PARTED) - kind
        return c

    def _frequent(self, policy: Policy, r: Request, context: np.ndarray, k: int, depth: int,
                  prefix_ids: np.ndarray, prefix_rows: np.ndarray) -> Candidate | None:
        """As SuffixDecoding, the most frequent path of at most k tokens over all outputs (G's
        and the one being written) or over the session's text, whichever scores higher (with
        `learned_paths`, the one the served model is expected to take more of; a tie to all
        outputs), as a candidate whose tokens have the kinds of their source and frequency
        class at this extension depth (0: a path of its own). prefix_ids and prefix_rows: the
        token before it, or the ids and rows of the path it continues. None: no path."""
        found = frequent_candidate(
            policy.sessions[r.session].s, policy.g, context, k, policy.frequency_kind_tables[depth],
            policy.token_classes, prefix_ids, prefix_rows, session_text=self.session_text,
            worth=policy.running[r.id].worth)
        if found is None:
            return None
        tokens, m, ids, rows = found
        return Candidate(tokens, m, rows, ids if self.token_bias else NO_IDS, frequency=True)

    def _extended(self, policy: Policy, r: Request, c: Candidate, depth: int
                  ) -> Candidate | None:
        """Frequency path c continued by the frequency path after it (what follows the
        context and c's tokens, as if the output had written them); the continuation's
        tokens have kinds of their own for each depth, so the acceptance model learns how
        far such continuations are taken (at the lengths after c's). None when nothing
        follows. The tokens c shares with a copy keep their blended hazards."""
        max_k = policy.config.max_k
        # the step's context (already ids) with c's tokens after it
        context = context_ids(np.concatenate((policy.running[r.id].context, c.tokens))[-max_k:])
        # (without token offsets c has no ids: the continuation's are not read either)
        prefix_ids = c.ids if len(c.ids) else np.zeros(len(c.tokens) + 1, dtype=np.int64)
        longer = self._frequent(policy, r, context, max_k - len(c.tokens), depth + 1,
                                prefix_ids, c.rows)
        if longer is None:
            return None
        return replace(longer, tokens=c.tokens + longer.tokens, m=c.m, agreed=c.agreed)

    def _candidate(self, policy: Policy, tokens: list[int], m: int, kind: int, before: int
                   ) -> Candidate:
        """A copy of these tokens after a context of m matched tokens, its rows of `kind`;
        `before`: the token the draft follows."""
        ids = draft_ids(before, tokens) if self.token_bias else NO_IDS
        rows = token_rows(kind, ids[1:] if self.token_bias else tokens, policy.token_classes)
        return Candidate(tokens, m, rows, ids)

    def observe(self, policy: Policy, request: Request, drafted: int, accepted: int) -> None:
        """Keeps what the step showed (the tokens the target wrote) for the request's next
        plan, which learns it first: the compiled plan in its own call, where learning it
        here took a kernel call per candidate and most of observe's time. At batch 1 that
        is the same order; in a batch, a row learns its last step just before it plans.
        `Policy.finish` and `Policy.state` learn what is still kept."""
        run = policy.running[request.id]
        if run.pending is not None:  # (observed twice without a plan between)
            self.learn(policy, run)
        run.pending = (request.role, drafted, accepted, request.tokens[run.fed:],
                       len(request.tokens))

    def learn(self, policy: Policy, run: _Running) -> None:
        """Learn from the request's last step (`run.pending`, the step `run.step()`): its
        candidates scored against what the target wrote (all of them, drafted or not, with
        score_all, else the draft sent, up to the target's token after it) and observed,
        the row charged to R, the draft's sent ratio moved (`_policy_nb._learn` does the
        same inside the compiled plan)."""
        role, drafted, accepted, revealed, _ = run.pending
        run.pending = None
        candidates, sent, key = run.step()
        expected, cost = run.step_costs
        both = len(candidates[0].agreed) if candidates else 0
        if both:  # (with the hazards the plan blended, before this step moves them)
            copy, path = candidates
            known, matched = scored(path.tokens[:both], revealed)
            policy.acceptance.learn_blend(role, (copy.m, copy.rows, copy.ids),
                                          (path.m, path.rows, path.ids), known, matched)
        cut = None if self.score_all else drafted + 1
        for c in candidates if self.score_all else [sent] if sent else []:
            known, matched = scored(c.tokens[:cut], revealed)
            policy.acceptance.observe(role, c.m, known, matched, c.rows, c.ids)
        policy.acceptance.charge(float(cost), accepted)
        if drafted:
            policy.acceptance.observe_sent(key, float(expected), accepted)


def common_width(policy: Policy, batch: Sequence[Request], steps: list[tuple],
                 costs: np.ndarray) -> int:
    """The draft width for a batch whose rows all pay for the widest: the one where the
    rows' expected accepted tokens (each its sent candidate's, up to its length) gain most
    against what a step of that width costs, R tokens per plain step for every row.
    steps: each row's step, as `_Running.step` reads it."""
    expected, rates = [], 0.0  # per row: expected accepted tokens of its first n draft tokens
    for r, (_, sent, key) in zip(batch, steps):
        p = policy.acceptance.accept_probs(r.role, sent.m, sent.rows, ids=sent.ids,
                                           agreed=sent.agreed) if sent and sent.m > 0 else []
        expected.append(np.concatenate(([0.0], np.cumsum(p))))
        rates += policy.acceptance.planning_rate(key)
    widths = np.arange(min(max(map(len, expected)), len(costs)))
    accepted = sum(e[np.minimum(widths, len(e) - 1)] for e in expected)
    gain = accepted - rates * costs[widths]
    return int(np.argmax(gain))


# --- which corpus's match a request drafts from ------------------------------------------
@dataclass(frozen=True)
class Longest:
    """AgSpec: S, W and block history compete on match length (a tie keeps the earlier:
    block history, then S, then W); G wins only when longer by more than `delta`."""

    delta: int = 5

    def __post_init__(self) -> None:
        _check(self, "delta", self.delta >= 0, "must be at least 0")

    def choose(self, policy: Policy, request: Request,
               found: list[tuple[str, Match]]) -> tuple[str, Match]:
        best = ("", NO_MATCH)
        for src, m in found:
            if src != "G" and m.length > best[1].length:
                best = (src, m)
        g = next((m for src, m in found if src == "G"), None)
        if g is not None and g.length > best[1].length + self.delta:
            best = ("G", g)
        return best


@dataclass(frozen=True)
class MostExpected:
    """Ours: the match with the most expected accepted tokens under the acceptance model,
    which keeps a curve per draft kind (corpus and agreement of its occurrences)."""

    def choose(self, policy: Policy, request: Request,
               found: list[tuple[str, Match]]) -> tuple[str, Match]:
        if not found:
            return "", NO_MATCH
        kinds = [(draft_kind(src, m), m) for src, m in found]
        if len(kinds) == 1:  # nothing to weigh
            return kinds[0]
        return max(kinds, key=lambda c: policy.acceptance.expected(
            request.role, c[1].length, c[0], min(len(c[1].tokens), policy.config.max_k)))


LENGTHS = (Fixed, Alpha, Algorithm2, CostAware)
CHOOSERS = (Longest, MostExpected)


@dataclass(frozen=True)
class PolicyConfig:
    """One rung of the ladder: the corpora it drafts from, how it picks among their matches
    (`choose`) and how long it drafts (`length`)."""

    name: str
    session: bool = True
    workspace: bool = False  # W, raw files
    emission: bool = False  # W, diff emission forms too
    listings: bool = False  # S, file lines a tool showed numbered, also without the numbers
    global_: bool = False  # G
    isolate: bool = False  # drafts inside a block only from history of that block
    isolate_only: bool = False  # AgentSpec: block history is the only source
    follow: bool = False  # keep reading a continuation while the output copies it
    # an output's document in S and G starts with the prompt's last tokens (see output_lead)
    lead: bool = False
    choose: Longest | MostExpected = field(default_factory=Longest)
    length: Fixed | Alpha | Algorithm2 | CostAware = field(default_factory=Fixed)
    max_k: int = 64
    lam: float = 0.2
    s_max_tokens: int = 4_000_000
    g_max_tokens: int = 20_000_000

    def __post_init__(self) -> None:
        """A bad strategy or value fails here, naming it, never silently later."""
        def bad(field_: str, why: str) -> None:
            raise ValueError(f"policy {self.name!r}: {field_}={getattr(self, field_)!r} {why}")

        if not isinstance(self.length, LENGTHS):
            bad("length", f"is not a length strategy ({', '.join(c.__name__ for c in LENGTHS)})")
        if not isinstance(self.choose, CHOOSERS):
            bad("choose", f"is not a chooser ({', '.join(c.__name__ for c in CHOOSERS)})")
        if isinstance(self.choose, MostExpected) and not isinstance(self.length, CostAware):
            bad("length", "must be CostAware with the MostExpected chooser: both read the "
                "acceptance model only CostAware trains")
        for field_ in ("max_k", "s_max_tokens", "g_max_tokens"):
            if getattr(self, field_) < 1:
                bad(field_, "must be at least 1")
        # a measured lambda may pass 1 (a tiny model on a CPU): it only makes drafts dear
        if not 0.0 <= self.lam < float("inf"):
            bad("lam", "must be a number >= 0")


@dataclass
class _Session:
    s: Corpus
    w: Corpus
    blocks: dict[tuple[str, str, str | None], Corpus] = field(default_factory=dict)
    listings: set[str] = field(default_factory=set)  # unnumbered listings already in s
    unformed: list[list[int]] = field(default_factory=list)  # files without emission forms


class StepBuffers(NamedTuple):
    """Where a request's plan keeps its step, until the next plan has learned from it: the
    path's ids (the token before it, then its tokens) and rows, the copy's, the blended
    hazards of the tokens both say, the frequency search's drafts, the sent ratios' keys of
    the request's role (`_sent_keys`) and their slots, what was decided
    (`_policy_nb.keep`'s layout) and the draft sent's expected accepted tokens and cost; and
    whether its tokens' offsets are read (`token_bias`)."""

    ids: np.ndarray
    rows: np.ndarray
    copy_ids: np.ndarray
    copy_rows: np.ndarray
    agreed: np.ndarray
    found: np.ndarray
    found_tokens: np.ndarray
    keys: tuple[str, ...]
    slots: np.ndarray
    kept: np.ndarray
    step_costs: np.ndarray
    with_ids: bool


def step_buffers(policy: Policy, role: str) -> StepBuffers:
    """Empty buffers for a request of this role (nothing kept)."""
    max_k, keys = policy.config.max_k, _sent_keys(role)
    return StepBuffers(*(np.empty(n, dtype=np.int64) for n in (max_k + 1, max_k) * 2),
                       np.empty(max_k), *frequent_buffers(max_k, shared=False), keys,
                       policy.acceptance.ratio_slots(keys),
                       np.array([0, 0, 0, 0, -1, 0, -1, 0], dtype=np.int64), np.zeros(2),
                       policy.config.length.token_bias)


@dataclass
class _Running:
    """Per-request state: output tokens already absorbed, PDA, the copy being followed, and
    (CostAware) the step planned."""

    fed: int = 0
    tracker: BlockTracker | None = None
    # the last retrieval, advanced while the output keeps copying it (NO_MATCH where the
    # compiled plan looked it up: then `looked`)
    match: Match = field(default_factory=lambda: NO_MATCH)
    source: str = ""  # corpus the match came from: S, W, G or B (block history); with
    # choose="expected" its draft_kind
    context: np.ndarray | None = None  # the step's last max_k tokens, as ids to look up
    window: ContextWindow | None = None  # where the step's context is read
    worth: np.ndarray | None = None  # Policy.path_worth, as this step's frequency paths read it
    looks_up: bool = False  # the step's copy is looked up by the compiled plan (see propose)
    looked: tuple | None = None  # what it found, whose continuation is the copy kept (see
    # Policy._follow_looked)
    # what the last step showed, until the next plan learns it (CostAware.observe)
    pending: tuple | None = None
    buffers: StepBuffers | None = None  # (CostAware) the step planned

    def keep(self, candidates: list[Candidate], sent: Candidate | None, key: str,
             before: int, step_costs: tuple[float, float]) -> None:
        """Keep a step the Python plan made, as the compiled plan keeps its own: its
        candidates (a copy, a path), the one sent (the path's, up to its length there),
        its sent ratio's key ("": none), the token the drafts follow, and the draft's
        expected accepted tokens and cost."""
        b = self.buffers
        copy = next((c for c in candidates if not c.frequency), None)
        path = next((c for c in candidates if c.frequency), None)
        both = len(path.agreed) if path else 0
        b.agreed[:both] = path.agreed if path else NO_HAZARDS
        for c, ids, rows in ((copy, b.copy_ids, b.copy_rows), (path, b.ids, b.rows)):
            if c is not None:
                ids[0], ids[1 : len(c.tokens) + 1], rows[: len(c.tokens)] = \
                    before, c.tokens, c.rows
        b.kept[:] = (copy.m if copy else 0, len(copy.tokens) if copy else 0,
                     path.m if path else 0, len(path.tokens) if path else 0,
                     -1 if sent is None else int(sent.frequency),
                     len(sent.tokens) if sent and sent.frequency else 0,
                     b.keys.index(key) if key else -1, both)
        b.step_costs[:] = step_costs

    def step(self) -> tuple[list[Candidate], Candidate | None, str]:
        """The step kept (see `keep`): its candidates (the copy, then the path), the one
        sent (None: none) and its sent ratio's key ("": none). Views of the buffers, read
        only until the next plan."""
        b = self.buffers
        copy_m, copy_length, path_m, path_length, sent, sent_length, key, both = b.kept.tolist()

        def candidate(ids, rows, m, length, frequency):
            return Candidate(ids[1 : length + 1].tolist(), m, rows[:length],
                             ids[: length + 1] if b.with_ids else NO_IDS, frequency,
                             b.agreed[:both])

        copy = candidate(b.copy_ids, b.copy_rows, copy_m, copy_length, False) \
            if copy_m else None
        path = candidate(b.ids, b.rows, path_m, path_length, True) if path_length else None
        chosen = copy if sent == 0 else None
        if sent == 1:  # (the draft sent may stop short of a continuation scored with it)
            chosen = path if sent_length == path_length \
                else candidate(b.ids, b.rows, path_m, sent_length, True)
        return [c for c in (copy, path) if c], chosen, b.keys[key] if key >= 0 else ""

    @property
    def step_costs(self) -> np.ndarray:
        """The draft sent's expected accepted tokens and what it costs, in plain steps."""
        return self.buffers.step_costs


@dataclass
class Candidate:
    """A draft the policy may send: its tokens, the matched context behind its first token,
    each token's row in the acceptance model (kind and modifiers), what its tokens'
    offsets are read with (allocator.draft_ids; NO_IDS: none), and the hazards of its first
    tokens where the step's other candidate says them too (`blended_pair`)."""

    tokens: list[int]
    m: int
    rows: np.ndarray
    ids: np.ndarray
    frequency: bool = False  # a frequency path, not a copy
    agreed: np.ndarray = field(default_factory=lambda: NO_HAZARDS)


def agreed(a: Candidate, b: Candidate) -> list[Candidate]:
    """Two candidates of a step, each token's row moved by what the other says of it
    (`allocator.agreement`)."""
    return [replace(a, rows=a.rows + TOKEN_CLASSES * agreement(a.tokens, b.tokens)),
            replace(b, rows=b.rows + TOKEN_CLASSES * agreement(b.tokens, a.tokens))]


def blended_pair(acceptance: AcceptanceModel, role: str, a: Candidate, b: Candidate
                 ) -> list[Candidate]:
    """A copy and a frequency path (either order), the tokens both say first given the
    role's blend of their two hazards (`AcceptanceModel.agreed_hazards`)."""
    copy, path = (b, a) if a.frequency else (a, b)
    hazards = acceptance.agreed_hazards(role, (copy.m, copy.rows, copy.ids),
                                        (path.m, path.rows, path.ids),
                                        parted(copy.tokens, path.tokens))
    return [replace(c, agreed=hazards) for c in (a, b)]


def sent_key(role: str, frequency: bool, candidates: int) -> str:
    """Whose sent ratio prices a candidate (AcceptanceModel.sent_ratio): its role, copy or
    frequency path, and how many candidates the step had (whether another competed with
    it). The winner's curse differs between them: on SWE-agent (32 sessions, seed 7, at
    c0df06c) a copy sent beside a frequency path took as many tokens as predicted, a path
    sent beside a copy 0.91 of them, a lone path 0.84. A path continued past its end takes
    a "+" per continuation (and took 0.55-0.77 of its prediction)."""
    return f"{role}/{'frequency' if frequency else 'copy'}/{candidates}"


@lru_cache(maxsize=256)
def _sent_keys(role: str) -> tuple[str, ...]:
    """The keys a compiled plan may price with (`_policy_nb.plan_request`): the copy's, as
    the step's only candidate and beside a path; then the path's, and its continuations',
    as the only candidate and beside a copy; last the role's quiet key."""
    return (sent_key(role, False, 1), sent_key(role, False, 2),
            *(sent_key(role, True, candidates) + "+" * depth
              for candidates in (1, 2) for depth in range(EXTENSIONS + 1)), role + QUIET)


# a line of a numbered listing: SWE-agent's viewer and grep -n ("12:text"), cat -n and nl
# ("    12\ttext")
_NUMBERED = re.compile(r"^ *(\d+)(?::|\t)(.*)$")
MIN_LISTING_LINES = 3


def numbered_listings(text: str) -> list[str]:
    """The file slices a tool showed as numbered lines, numbers stripped: each run of at least
    MIN_LISTING_LINES lines numbered n, n+1, n+2, ... An agent that edits copies the lines,
    never their numbers."""
    listings, run, last = [], [], None
    for line in text.split("\n") + [""]:
        m = _NUMBERED.match(line)
        number = int(m.group(1)) if m else None
        if run and (number is None or number != last + 1):
            if len(run) >= MIN_LISTING_LINES:
                listings.append("".join(l + "\n" for l in run))
            run = []
        if number is not None:
            run.append(m.group(2))
        last = number
    return listings


def output_lead(tokens: Sequence[int], num_prompt: int) -> Sequence[int]:
    """The prompt's last MAX_CONTEXT tokens (`tokens[:num_prompt]` is the prompt; the chat
    template's assistant header among them), which an output's document in S and G starts
    with: the first tokens of an output then follow a context that earlier outputs' first
    tokens followed, as the frequency search reads at any later position (which otherwise
    had only text no output ever followed)."""
    return tokens[max(0, num_prompt - MAX_CONTEXT) : num_prompt]


def emission_forms(text: str) -> tuple[str, str]:
    """The forms a unified diff copies a file in: context lines and removed lines."""
    lines = text.splitlines()
    return ("".join(" " + l + "\n" for l in lines), "".join("-" + l + "\n" for l in lines))


def draft_kind(source: str, m: Match) -> str:
    """What the acceptance model keeps a hazard curve for, beside the role: the corpus and
    whether the match's occurrences agree on what follows ("1": one occurrence, "=": all
    agree, "~": split). A continuation every earlier occurrence took is likelier to be taken
    again than one a vote picked. A copy's tokens past the common prefix of its occurrences'
    continuations (`Match.agreed`) have that kind + PARTED ("S=>", "W~>"): there the
    occurrences it agreed with went on differently."""
    return source + occurrences_agree(m.candidates, m.agree)


PARTED = ">"  # (see draft_kind)


def occurrences_agree(occurrences: int, agree: int) -> str:
    """`draft_kind`'s agreement of a match's occurrences: "1" one, "=" all, "~" a vote."""
    return "1" if occurrences <= 1 else "=" if agree == occurrences else "~"


class Policy:
    def __init__(self, config: PolicyConfig, encode: Callable[[str], list[int]] | None = None,
                 token_bytes: list[bytes] | None = None, kmax: KmaxTable | None = None,
                 draft_costs: Callable[[int, int], np.ndarray] | None = None,
                 lam_at: Callable[[int], float] | None = None,
                 global_seed: Sequence[Sequence[int]] = ()):
        self.config = config
        self.name = config.name
        self._seeded = sum(1 for output in global_seed if len(output))
        self.served_sessions = 0
        self.kmax_profile = kmax is not None
        self.encode = encode
        self.token_bytes = token_bytes
        # C[n]: what n draft tokens per row cost at a batch size, in plain decode steps; the
        # engine's own steps (observe_step) replace the profile's prices once they can
        self.costs = LearnedCosts(draft_costs or (lambda b, k: linear_costs(config.lam, k)))
        self._costs: dict[int, np.ndarray] = {}  # by batch size: read once, not every step
        self.controller = Controller(lam=config.lam, kmax=dict(kmax.kmax) if kmax else {})
        # lambda at a batch size (a cost profile's lambda(b)); else config.lam at every size
        self.lam_at = lam_at or (lambda b: config.lam)
        cost = config.length if isinstance(config.length, CostAware) else CostAware()
        self.acceptance = AcceptanceModel(max_k=config.max_k, prior=kmax.hazard if kmax else None,
                                          calibrate_sent=cost.calibrate_sent)
        self.sessions: dict[str, _Session] = {}
        self.running: dict[str, _Running] = {}
        self.warnings: list[str] = []
        # frequency drafts read contexts down to one token; copies start at two
        self._min_context = 1 if cost.frequency else None
        # G's own copies repeat what the frequency draft over all outputs reads there (the
        # same outputs, each continuation weighed by how often it followed): with that draft,
        # G feeds it alone, and a step makes one lookup less
        self._copies_from_g = not cost.frequency
        self.g = self._corpus(config.g_max_tokens) if config.global_ else None
        for tokens in global_seed if self.g is not None else ():
            self.g.extend(tokens)
            self.g.end_document()
        # each token's class (see allocator.MODIFIERS); all one class (empty) without a
        # tokenizer
        self.token_classes = token_classes(token_bytes) \
            if token_bytes and cost.token_classes else np.zeros(0, dtype=np.intp)
        self._worth: dict[str, tuple] = {}  # role: (its table, its age) (see role_worth)
        # the acceptance model's kind of each frequency class, from G and from S; by
        # extension depth, from S and from G: 0 for a path of its own, then the paths that
        # continue one (CostAware.extend: "+SF<.8x2", "++F1x4", ...)
        self.frequency_kinds, self.session_frequency_kinds = (
            np.array([self.acceptance.kind(source + k) for k in FREQUENCY_CLASSES])
            for source in ("", "S")) if cost.frequency else (None, None)
        self.frequency_kind_tables = [np.stack([self.session_frequency_kinds,
                                                self.frequency_kinds])] if cost.frequency else []
        for depth in range(1, EXTENSIONS + 1) if cost.extend else ():
            self.frequency_kind_tables.append(np.array(
                [[self.acceptance.kind("+" * depth + source + k) for k in FREQUENCY_CLASSES]
                 for source in ("S", "")]))
        # (the tables as one array, as the compiled plan reads them)
        self.frequency_kind_array = np.stack(self.frequency_kind_tables) \
            if self.frequency_kind_tables else np.zeros((1, 2, len(FREQUENCY_CLASSES)),
                                                        dtype=np.int64)
        # plans in one compiled call (CostAware._plan_compiled) where every kernel it
        # stands for is in use: the corpora's and the acceptance model's
        self.compiled = _nb is not None and match._nb is not None and allocator._nb is not None
        # the kinds of copies from S, by draft_kind's agreement ("1", "=", "~", then past
        # the occurrences' common prefix), as a compiled plan that looks the copy up itself
        # gives them (see propose)
        self.copy_kinds = np.array([self.acceptance.kind("S" + a)
                                    for a in ("1", "=", "~", "=" + PARTED, "~" + PARTED)])
        # whether a compiled plan may: MostExpected takes a lone match as it is
        self._lookup_in_plan = isinstance(config.length, CostAware) \
            and isinstance(config.choose, MostExpected)
        # what every compiled plan reads of the corpora and the policy that never changes,
        # in `_policy_nb.plan_request`'s order (see role_constants)
        self._search_constants = search_constants(self._corpus(None)) if self.compiled else ()
        self._plan_constants = (config.max_k, cost.frequency and config.session,
                                cost.session_text, self.frequency_kind_array,
                                self.token_classes, cost.token_bias, self.copy_kinds,
                                config.follow, TOKEN_CLASSES if cost.agreement else 0,
                                EXTENSIONS if cost.extend else 0, cost.score_all,
                                cost.blend, cost.quiet)
        self._role_constants: dict[str, tuple] = {}
        warm_up(token_bytes)

    def _corpus(self, max_tokens: int) -> Corpus:
        """A corpus the frequency candidate may read as well as copies."""
        return Corpus(max_tokens=max_tokens, min_context=self._min_context)

    @property
    def global_seed_outputs(self) -> int:
        """How many past outputs this policy was given (0 when it uses none)."""
        return self._seeded if self.g is not None else 0

    # --- text the session saw -------------------------------------------------------
    def _session(self, sid: str) -> _Session:
        if sid not in self.sessions:
            self.sessions[sid] = _Session(self._corpus(self.config.s_max_tokens),
                                          Corpus(max_tokens=self.config.s_max_tokens))
        return self.sessions[sid]

    def register(self, session: str, kind: str, tokens: Sequence[int], path: str = "") -> None:
        st = self._session(session)
        if kind == FILE:
            if not self.config.workspace:
                return
            st.w.extend(tokens)
            st.w.end_document()
            if self.config.emission and self.encode and self.token_bytes:
                st.unformed.append(list(tokens))  # (see _form)
        elif kind != OUTPUT and self.config.session:
            st.s.extend(tokens)
            st.s.end_document()
            if self.config.listings and self.encode and self.token_bytes:
                for listing in numbered_listings(text_of(self.token_bytes, tokens)):
                    if listing not in st.listings:  # a window shown again adds nothing
                        st.listings.add(listing)
                        st.s.extend(self.encode(listing))
                        st.s.end_document()

    # --- requests --------------------------------------------------------------------
    def start(self, request: Request) -> None:
        st = self._session(request.session)
        # index the text registered since the last request now, not in its first decoding step
        for corpus in (st.s, st.w, self.g):
            if corpus is not None:
                corpus.flush()
        run = _Running(fed=request.num_prompt, window=ContextWindow(self.config.max_k))
        if isinstance(self.config.length, CostAware):
            run.buffers = step_buffers(self, request.role)
        if self.config.session and self.config.lead:
            st.s.end_document()  # (a lead starts a document, glued to no other request's)
            st.s.extend(output_lead(request.tokens, request.num_prompt))
        if self.config.isolate and request.structure and self.token_bytes is not None:
            try:
                pairs = parse_structure([list(p) for p in request.structure])
                run.tracker = BlockTracker(pairs, self.token_bytes)
            except StructureError as e:
                self.warnings.append(f"request {request.id}: structure ignored ({e})")
        self.running[request.id] = run

    def _absorb(self, request: Request, run: _Running) -> list[int]:
        """Move newly generated output tokens into S and the block history; returns them."""
        new = request.tokens[run.fed:]
        if not new:
            return new
        run.fed = len(request.tokens)
        st = self.sessions[request.session]
        if st.unformed:
            self._form(st, request.tokens[-len(new) - 1 :])
        if self.config.session:
            st.s.extend(new)
        # text outside every block is only read where block history is the only source
        # (elsewhere S holds it already: see _candidates); without a tracker every token is
        # outside, so there is nothing to do unless that text is kept
        keep_outside = self.config.isolate_only
        if self.config.isolate and (run.tracker is not None or keep_outside):
            labels = run.tracker.feed(new) if run.tracker else [None] * len(new)
            start = 0
            for i in range(1, len(new) + 1):
                if i == len(new) or labels[i] != labels[start]:
                    if labels[start] is not None or keep_outside:
                        self._block(st, request, labels[start]).extend(new[start:i])
                    start = i
        return new

    def _form(self, st: _Session, written: list[int]) -> None:
        """Put the session's files in W in their diff emission forms once an output writes
        a hunk header ("@@", which every context and removed line of a unified diff
        follows; `written`: the new tokens and the one before them, as one may be cut
        between two). Encoding both forms of a file is most of what registering it costs
        (the tokenizer): a session whose outputs never write a diff does not pay it."""
        if "@@" not in text_of(self.token_bytes, written):
            return
        for tokens in st.unformed:
            for form in emission_forms(text_of(self.token_bytes, tokens)):
                st.w.extend(self.encode(form))
                st.w.end_document()
        st.unformed.clear()

    def _block(self, st: _Session, request: Request, label: str | None) -> Corpus:
        key = (request.agent, request.query, label)
        if key not in st.blocks:
            st.blocks[key] = Corpus(max_tokens=self.config.s_max_tokens)
        return st.blocks[key]

    def _sources(self, request: Request, run: _Running) -> list[tuple[str, Corpus]]:
        """The corpora this request's retrieval reads, tagged by source, in the order ties
        keep them: the open block's history, S, W, G."""
        cfg = self.config
        st = self.sessions[request.session]
        sources = []
        if cfg.isolate:
            label = run.tracker.block if run.tracker else None
            key = (request.agent, request.query, label)
            # outside every block, S already holds all of the block history: skip it
            if key in st.blocks and (label is not None or cfg.isolate_only):
                sources.append(("B", st.blocks[key]))
            if cfg.isolate_only:
                return sources
        if cfg.session and len(st.s):
            sources.append(("S", st.s))
        if cfg.workspace and len(st.w):
            sources.append(("W", st.w))
        if self._copies_from_g and self.g is not None and len(self.g):
            sources.append(("G", self.g))
        return sources

    def _candidates(self, run: _Running, sources: list[tuple[str, Corpus]], k: int
                    ) -> list[tuple[str, Match]]:
        """The match in each of the sources, tagged by source (those that matched)."""
        found = [(src, self._written(corpus, run.context, k) if src in ("B", "S")
                  else corpus.match(run.context, k)) for src, corpus in sources]
        return [(src, m) for src, m in found if m.length]

    def _written(self, corpus: Corpus, ctx: list[int], k: int) -> Match:
        """The match in a corpus the output is being appended to. With `follow`, a
        continuation that runs up to the output's last token (the output is repeating
        itself) goes on repeating that stretch, as an overlapping copy does: the next tokens
        of the copy are the ones it is about to write."""
        return self.repeated(corpus, corpus.match(ctx, k), k)

    def repeated(self, corpus: Corpus, m: Match, k: int) -> Match:
        """m, with `follow`, repeated to k tokens where it runs into the open end of the
        corpus (see `_written`)."""
        if self.config.follow and 0 < len(m.tokens) < k and corpus.reaches_open_end(m):
            m = replace(m, tokens=(m.tokens * (k // len(m.tokens) + 1))[:k])
        return m

    def _follow(self, run: _Running, new: list[int]) -> Match | None:
        """While the output keeps copying the last continuation, keep reading it: the
        match grows by what was copied, and no lookup is needed."""
        if run.looked is not None:
            return self._follow_looked(run, new)
        m, n = run.match, len(new)
        if not m.length or len(m.tokens) <= n or m.tokens[:n] != new:
            return None
        return Match(length=m.length + n, tokens=m.tokens[n:], candidates=m.candidates,
                     agree=m.agree, agreed=max(0, m.agreed - n), position=m.position + n)

    def _follow_looked(self, run: _Running, new: list[int]) -> Match | None:
        """`_follow` of the match the compiled plan looked up in S: its continuation is the
        copy it kept (`run.looked`: the match's length, occurrences, agreeing ones, their
        common prefix and its position)."""
        length, occurrences, agree, agreed, position = run.looked
        n, copy_length, ids = len(new), int(run.buffers.kept[1]), run.buffers.copy_ids
        if copy_length <= n or ids[1 : n + 1].tolist() != new:
            return None
        return Match(length + n, ids[n + 1 : copy_length + 1].tolist(), occurrences, agree,
                     max(0, agreed - n), position + n)

    def propose(self, batch: Sequence[Request], padded: bool = False) -> list[list[int]]:
        cfg = self.config
        # every row's new tokens first: each row's lookups, in retrieval or in the plan,
        # read the same text (rows of one session share S)
        news = [self._absorb(r, self.running[r.id]) for r in batch]
        matches = []
        for r, new in zip(batch, news):
            run = self.running[r.id]
            run.context = run.window.ids(r.tokens)  # once, for every corpus
            followed = self._follow(run, new) if new and cfg.follow else None
            run.looks_up, run.looked = False, None
            if followed is None:
                sources = self._sources(r, run)
                # where S alone is read, and its match taken as it is, the compiled plan looks
                # it up in its own call (CostAware._plan_compiled sets the match and source)
                run.looks_up = self.compiled and self._lookup_in_plan and len(sources) == 1 \
                    and sources[0][0] == "S"
                if run.looks_up:
                    followed = NO_MATCH
                else:
                    run.source, followed = cfg.choose.choose(
                        self, r, self._candidates(run, sources, cfg.max_k))
            run.match = followed
            matches.append(followed)
        return cfg.length.drafts(self, batch, matches, padded)

    def costs_at(self, b: int) -> np.ndarray:
        """C[n] at batch size b, read once per size until the learned prices change."""
        if b not in self._costs:
            self._costs[b] = self.costs.draft_costs(b, self.config.max_k)
        return self._costs[b]

    def observe_step(self, verified: Sequence[int], seconds: float) -> None:
        if self.costs.observe(verified, seconds):
            self._costs.clear()

    def role_constants(self, role: str) -> tuple:
        """What a compiled plan of this role reads that changes only when the role's tables
        grow: the corpora's constants (`match.search_constants`), the role's tables
        (`AcceptanceModel.kernel_tables`), then the policy's, in one tuple."""
        tables = self.acceptance.kernel_tables(role)
        kept = self._role_constants.get(role)
        if kept is None or kept[0] is not tables:
            kept = self._role_constants[role] = (
                tables, (*self._search_constants, *tables, *self._plan_constants))
        return kept[1]

    def role_worth(self, role: str) -> tuple[np.ndarray, np.ndarray]:
        """What a frequency path's token is worth to the served model, by source (session
        text, all outputs), frequency class and matched length: the acceptance model's kind
        curves, read anew every WORTH_EVERY steps of a role (they move slowly), as the table
        and its age (its reads since; from WORTH_EVERY, due). The compiled plan reads them
        in its kernel, after it has learned the step kept; `path_worth` here."""
        worth = self._worth.get(role)
        if worth is None:
            shape = (2, len(FREQUENCY_CLASSES), self.config.max_k + 1)
            worth = self._worth[role] = (np.zeros(shape), np.array([WORTH_EVERY], dtype=np.int64))
        return worth

    def path_worth(self, role: str) -> np.ndarray:
        """`role_worth`'s table, read anew where due (the Python plan's, after it learned)."""
        table, age = self.role_worth(role)
        if age[0] >= WORTH_EVERY:
            lengths = self.config.max_k + 1
            table[:] = np.stack([self.acceptance.kind_hazards(role, kinds, lengths) for kinds in
                                 (self.session_frequency_kinds, self.frequency_kinds)])
            age[0] = 0
        age[0] += 1
        return table

    def observe(self, request: Request, drafted: int, accepted: int) -> None:
        self.config.length.observe(self, request, drafted, accepted)

    def finish(self, request: Request) -> None:
        run = self.running.pop(request.id)
        if run.pending is not None:
            self.config.length.learn(self, run)
        self._absorb(request, run)
        st = self.sessions[request.session]
        st.s.end_document()
        for corpus in st.blocks.values():
            corpus.end_document()
        if self.g is not None and request.output:
            if self.config.lead:
                self.g.extend(output_lead(request.tokens, request.num_prompt))
            self.g.extend(request.output)
            self.g.end_document()

    def drop_session(self, session: str) -> None:
        self.sessions.pop(session, None)

    def state(self) -> dict[str, np.ndarray]:
        """What this policy learned that outlives its sessions: the acceptance model, the
        engine's step costs, the outputs G holds, and the path worth each role last read
        (with its age: a restored policy drafts exactly as this one would go on to). What
        running requests' last steps showed is learned first."""
        for run in self.running.values():
            if run.pending is not None:
                self.config.length.learn(self, run)
        state = {f"acceptance/{k}": v for k, v in self.acceptance.state().items()}
        state.update({f"costs/{k}": v for k, v in self.costs.state().items()})
        if self.g is not None:
            documents = self.g.documents()
            state["g/tokens"] = np.concatenate(documents) if documents \
                else np.zeros(0, dtype=np.int32)
            state["g/lengths"] = np.array([len(d) for d in documents], dtype=np.int64)
        roles = sorted(self._worth)
        state["worth/roles"] = np.array(roles, dtype=str)
        state["worth/ages"] = np.array([self._worth[r][1][0] for r in roles], dtype=np.int64)
        state["worth/tables"] = np.array([self._worth[r][0] for r in roles], dtype=np.float64)
        state["served"] = np.array([self.served_sessions, self._seeded], dtype=np.int64)
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Take back what `state()` gave, before serving anything: it replaces what this
        policy learned so far, G's outputs included."""
        if self.sessions or self.running:
            raise ValueError("a policy takes a state back before it serves anything")
        self.acceptance.restore(_part(state, "acceptance/"))
        self.costs.restore(_part(state, "costs/"))
        self._costs.clear()
        if self.g is not None:
            tokens, lengths = state["g/tokens"], state["g/lengths"]
            if tokens.ndim != 1 or (lengths < 1).any() or lengths.sum() != len(tokens) \
                    or (len(tokens) and tokens.min() < 0):
                raise ValueError("G's outputs must be token ids cut into documents of "
                                 "the lengths given")
            self.g = self._corpus(self.config.g_max_tokens)
            for document in np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else ():
                self.g.extend(document)
                self.g.end_document()
        roles, ages, tables = state["worth/roles"], state["worth/ages"], state["worth/tables"]
        shape = (len(roles), 2, len(FREQUENCY_CLASSES), self.config.max_k + 1)
        if len(ages) != len(roles) or (len(roles) and tables.shape != shape):
            raise ValueError(f"path worth needs an age and a table of {shape[1:]} per role")
        self._worth = {str(r): (np.array(t, dtype=np.float64), np.array([a], dtype=np.int64))
                       for r, a, t in zip(roles, ages, tables)}
        self.served_sessions, self._seeded = (int(x) for x in state["served"])

    def serve_recorded(self, sessions: Sequence[TokenizedSession]) -> None:
        """Serve recorded sessions whose outputs are the target's, before the ones measured,
        as a server that served them would have: each output verifies the drafts (a replay
        at batch 1), the acceptance model learns from those steps, and each output joins G
        as its call finishes (counted with the outputs G was seeded with)."""
        replay(sessions, self)
        self.served_sessions += len(sessions)
        if self.g is not None:
            self._seeded += sum(1 for s in sessions for c in s.calls if c.output)


def _part(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays of `state` under `prefix`, named without it."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def warm_up(token_bytes: list[bytes] | None = None) -> None:
    """Run a throwaway `full` policy over a few synthetic steps, once per process, so that
    the numba kernels compile (seconds on a fresh install) or load from their disk cache
    while an engine or bench builds its drafter: not in a served request's first steps, and
    not in the steps a bench times."""
    global _kernels_ready
    if _kernels_ready:
        return
    _kernels_ready = True
    policy = Policy(ladder()["full"], token_bytes=token_bytes)
    vocab = len(token_bytes) if token_bytes else 1000
    rng = np.random.default_rng(0)
    # repeats, for copies; long enough that S's tail chains its entries (match._CHAIN_FROM)
    text = rng.integers(0, vocab, 400).tolist() * 3
    policy.register("warm-up", PROMPT, text)
    rows = [Request(f"warm-up#{i}", "warm-up", text[:20 + i], 20 + i, role="code")
            for i in range(2)]
    for r in rows:
        policy.start(r)
    for step in range(24):  # row by row, then as an engine that pads verifies them
        drafts = policy.propose(rows, padded=step >= 12)
        for r, draft in zip(rows, drafts):
            target = text[len(r.tokens) : len(r.tokens) + len(draft) + 1]
            accepted = scored(draft, target)[1]
            r.tokens.extend(target[: accepted + 1])
            policy.observe(r, len(draft), accepted)
    for r in rows:
        policy.finish(r)
    # a lookup outside the plan, as retrieval makes where S is not the only source
    policy.sessions["warm-up"].s.match(text[:20], 8)
    # a text longer than a tail: indexing it seals a sorted run
    policy.register("warm-up", PROMPT, rng.integers(0, vocab, TAIL_MAX + 1).tolist())
    policy.start(Request("warm-up#2", "warm-up", text[:20], 20, role="code"))


# `full`'s mechanisms, each switched off by one method: the field it clears, of
# PolicyConfig where that has it, else of CostAware
ABLATIONS = {
    "full-no-listings": "listings",
    "full-no-frequency": "frequency",
    "full-no-session-text": "session_text",
    "full-no-learned-paths": "learned_paths",
    "full-no-classes": "token_classes",
    "full-sent-only": "score_all",
    "full-no-sent-calibration": "calibrate_sent",
    "full-no-token-bias": "token_bias",
    "full-no-output-lead": "lead",
    "full-no-extension": "extend",
    "full-no-agreement": "agreement",
    "full-no-blend": "blend",
    "full-no-quiet": "quiet",
    "full-no-blocks": "isolate",
}


def ladder(lam: float = 0.2) -> dict[str, PolicyConfig]:
    """The method ladder of `agentspec bench`, each rung adding one mechanism."""
    session = PolicyConfig("session")
    workspace = replace(session, name="workspace", workspace=True)
    emission = replace(workspace, name="emission", emission=True)
    glob = replace(emission, name="global", global_=True)
    cost = CostAware(frequency=True, session_text=True, learned_paths=True, token_classes=True,
                     score_all=True, calibrate_sent=True, token_bias=True, extend=True,
                     agreement=True, blend=True, quiet=True)
    full = replace(glob, name="full", listings=True, isolate=True, follow=True, lead=True,
                   choose=MostExpected(), length=cost, lam=lam)
    return {
        "session": session,
        "workspace": workspace,
        "emission": emission,
        "global": glob,
        "fixed32": replace(glob, name="fixed32", length=Fixed(32)),
        "agspec": replace(glob, name="agspec", length=Alpha(), lam=lam),
        "agentspec-s": PolicyConfig("agentspec-s", session=False, isolate=True,
                                    isolate_only=True),
        "agentspec": PolicyConfig("agentspec", session=False, isolate=True, isolate_only=True,
                                  length=Algorithm2()),
        "full": full,
        # full with each of its mechanisms switched off, one at a time
        **{name: replace(full, name=name, **{switch: False}) if hasattr(full, switch)
           else replace(full, name=name, length=replace(cost, **{switch: False}))
           for name, switch in ABLATIONS.items()},
    }
