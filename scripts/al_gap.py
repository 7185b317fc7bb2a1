#!/usr/bin/env python
"""Where two methods' AL differ on a trace: their steps side by side, and what `full` passed over.

On the sessions `agentspec bench --backend replay` measures (the same task split, seed, sample
and past outputs), it replays `full` and a baseline (default `suffix`, warm as the
bench has it), records where in each output every step starts, what it drafted and what was
accepted, and lines the two methods' steps up by the output position they start at. It says:
- at positions where `full` sends a draft, and where it sends nothing: the draft tokens each
  method had accepted there, a step;
- where `full` sends nothing: how many tokens the baseline's drafts took (0, 1, 2 or more),
  and how many `full`'s own candidates would have had accepted, each cut to the length the
  baseline sent there: whether its candidates there are worse than the baseline's drafts,
  or only priced out;
- `full`'s candidates at the steps it sent nothing: the first-token probability its acceptance
  model gave them, by band, against how often that first token was the one written. Calibrated
  bands under the plan's price are drafts that would not have paid: a higher AL from them would
  cost speed.
- what sending there would have done, at a few prices of a token's predicted reach: the steps
  it would have saved, set against the steps the run took (a token gained where the run went
  on to cover it in a step of its own saves nothing), and the AL and speedup that gives;
- with hindsight (each of `full`'s candidates against the rest of the output the target went on
  to write), where the tokens its candidates held went: accepted; written after a sent draft
  that stopped short (its candidate ran on); held further by a candidate passed over; held at
  steps that sent nothing. And the sent drafts' calibration by position: each token's predicted
  probability of being reached, by band, against how often it was, inside the draft and in the
  three positions after it, for copies and frequency paths apart (the winner's curse, and
  whether the plan stops where the tokens stop paying);
- every candidate's scored positions (each token the target wrote at the step, up to the
  first one a candidate got wrong): the predicted probability that the token is accepted
  once the ones before it were, by band, against how often it was, for copies and frequency
  paths apart, by what the step's other candidate said of the token (`allocator.agreement`)
  and by where in the draft it stands (first, second or third, later). The acceptance model
  learns from these very positions; a band off here is a bias its rows do not see.

With `--frontier`, what that AL would cost: `full` planned for each cheaper draft price given
(its plan's lambda; the run is still priced at --lambda), its AL, rejected draft tokens and
modeled speedup beside the baseline's. Where its AL reaches the baseline's, the speedup it has
left says whether both can be had from what `full` predicts now.

    .venv/bin/python scripts/al_gap.py --traces ../shared/traces/sweagent-gpt4-run-1.jsonl.gz \\
        --sessions 32 --seed 7 --frontier 0.16,0.12,0.1
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentspec.allocator import AGREES, ALONE, DIFFERS, MODIFIERS, TOKEN_CLASSES  # noqa: E402
from agentspec.bench import make_drafter  # noqa: E402
from agentspec.metrics import Meter  # noqa: E402
from agentspec.policy import CostAware, Policy  # noqa: E402
from agentspec.replay import replay  # noqa: E402
from agentspec.speculation import accepted_prefix  # noqa: E402
from scripts.replay_options import (Watcher, add_replay_options, load_replay,  # noqa: E402
                                    saved)

BANDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
AGREEMENTS = {ALONE: "alone", AGREES: "agrees", DIFFERS: "differs"}  # a row's, by name


class Recorder(Watcher):
    """A drafter as the engine sees it, recording each step of each request: (request id,
    output position the step starts at) -> (drafted, accepted). Of a `full` policy it also
    records, at each step it drafted nothing, every candidate's predicted first-token
    probability and whether that token was the one written; and once a request finishes,
    every step's candidates set against the rest of its output (`hindsight`, and `reach`:
    the sent drafts' predicted reach probabilities with what happened, by kind and by
    inside the draft or after it); and at every step, each candidate's scored positions
    (`scored`: predicted hazard and outcome, by kind, agreement and position)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.steps: dict[tuple[str, int], tuple[int, int]] = {}
        self.drafts: dict[tuple[str, int], list[int]] = {}  # each step's draft sent
        # of a `full` policy, at each step it drafted nothing: its candidates' tokens, and
        # the one with the most expected accepted tokens, with each token's predicted reach
        self.silent_candidates: dict[tuple[str, int], list[list[int]]] = {}
        self.silent_best: dict[tuple[str, int], tuple[list[int], np.ndarray]] = {}
        self.outputs: dict[str, list[int]] = {}  # each finished request's whole output
        self.passed_over: list[tuple[float, bool]] = []
        # per request, full's steps not yet set against the whole output: (where the step
        # starts, tokens drafted, tokens accepted, each candidate as (tokens, the reach
        # probability of each token if it was sent, else None; whether it is a frequency path))
        self._open: dict[str, list[tuple[int, int, int, list[tuple]]]] = {}
        self.hindsight = {"accepted": 0, "sent_ran_on": 0, "rival_went_further": 0,
                          "sending_nothing": 0}
        self.reach: dict[tuple[str, str], list[tuple[float, bool]]] = {}
        self.scored: dict[tuple[str, str, str], list[tuple[float, bool]]] = {}

    def propose(self, batch, padded=False):
        drafts = super().propose(batch, padded)
        for r, draft in zip(batch, drafts):
            self.drafts[(r.id, self.at[r.id])] = list(draft)
        return drafts

    def observe(self, request, drafted, accepted):
        at = self.at[request.id]
        self.steps[(request.id, at)] = (drafted, accepted)
        policy = self.inner
        if isinstance(policy, Policy) and isinstance(policy.config.length, CostAware):
            step_candidates, sent, _ = policy.running[request.id].step()
            if not drafted:
                self.silent_candidates[(request.id, at)] = [list(c.tokens)
                                                            for c in step_candidates]
                reaches = [policy.acceptance.accept_probs(request.role, c.m, c.rows, ids=c.ids,
                                                          agreed=c.agreed)
                           for c in step_candidates]
                if reaches:
                    best = int(np.argmax([r.sum() for r in reaches]))
                    self.silent_best[(request.id, at)] = (list(step_candidates[best].tokens),
                                                          np.asarray(reaches[best], float))
                written = request.output[at]  # the target's token at the step's first position
                self.passed_over += [(float(r[0]), c.tokens[0] == written)
                                     for c, r in zip(step_candidates, reaches)]
            self._score(policy, request, request.output[at:], step_candidates)
            candidates = []
            for c in step_candidates:
                # (read before the policy learns from this step: what its plan saw)
                reach = policy.acceptance.accept_probs(request.role, c.m, c.rows, ids=c.ids,
                                                       agreed=c.agreed) \
                    if drafted and _sent_from(c, sent) else None
                candidates.append((c.tokens, reach, c.frequency))
            self._open.setdefault(request.id, []).append((at, drafted, accepted, candidates))
        self.inner.observe(request, drafted, accepted)

    def _score(self, policy: Policy, request, written: list[int], candidates) -> None:
        """Each candidate's positions the target wrote a token at, up to its first wrong
        one: the hazard its plan read there (before the policy learns from this step) and
        whether the token was right."""
        for c in candidates:
            known = min(len(c.tokens), len(written))
            if not known:
                continue
            reach = policy.acceptance.accept_probs(request.role, c.m, c.rows, known, c.ids,
                                                   c.agreed)
            for j in range(known):
                before = reach[j - 1] if j else 1.0
                if before <= 0.0:
                    break
                agreement = AGREEMENTS[c.rows[j] % MODIFIERS // TOKEN_CLASSES]
                where = "first" if j == 0 else "2nd-3rd" if j < 3 else "later"
                key = ("frequency" if c.frequency else "copy", agreement, where)
                right = c.tokens[j] == written[j]
                self.scored.setdefault(key, []).append((float(reach[j] / before), right))
                if not right:
                    break

    def finish(self, request):
        output = request.output
        self.outputs[request.id] = list(output)
        for at, n, accepted, candidates in self._open.pop(request.id, []):
            went_on = [(accepted_prefix(tokens, output[at:]), reach, frequency)
                       for tokens, reach, frequency in candidates]
            best = max((held for held, *_ in went_on), default=0)
            sent = next((c for c in went_on if c[1] is not None), None)
            self.hindsight["accepted"] += accepted
            if sent is None:
                self.hindsight["sending_nothing"] += best
                continue
            held, reach, frequency = sent
            self.hindsight["sent_ran_on"] += held - accepted
            self.hindsight["rival_went_further"] += best - held
            kind = "frequency" if frequency else "copy"
            for j in range(min(n + 3, len(reach))):
                where = "sent" if j < n else "after"
                self.reach.setdefault((kind, where), []).append((float(reach[j]), held > j))
        self.inner.finish(request)


def _sent_from(candidate, sent) -> bool:
    """Whether the draft sent is this candidate, or a frequency path cut from it before a
    continuation that was scored with it (CostAware keeps the longer one as the candidate)."""
    return candidate is sent or (sent is not None and candidate.frequency and sent.frequency
                                 and candidate.tokens[: len(sent.tokens)] == sent.tokens)


def by_band(pairs: list[tuple[float, bool]], right: str) -> list[dict]:
    """(predicted probability, outcome) pairs by band of the prediction: how many, the mean
    prediction, and how often the outcome (named `right`) was true."""
    p, hit = (np.array(x) for x in zip(*pairs)) if pairs else (np.zeros(0), np.zeros(0, bool))
    bands = []
    for lo, hi in zip(BANDS, BANDS[1:]):
        inside = (p >= lo) & ((p < hi) if hi < 1.0 else (p <= hi))
        if inside.any():
            bands.append({"band": [lo, hi], "candidates": int(inside.sum()),
                          "predicted": round(float(p[inside].mean()), 3),
                          right: round(float(hit[inside].mean()), 3)})
    return bands


def print_bands(title: str, groups: dict[str, list[dict]], outcome: str) -> None:
    """Groups of `by_band` bands, a line each: count at predicted -> how often `outcome`."""
    print(title)
    for name, bands in groups.items():
        print(f"  {name}: " + "; ".join(
            f"[{b['band'][0]:.1f}, {b['band'][1]:.1f}] {b['candidates']} at {b['predicted']:.3f}"
            f" -> {b[outcome]:.3f}" for b in bands))


def compare(full: Recorder, base: Recorder) -> dict:
    """The aligned steps, the calibration of what `full` passed over, and where its
    candidates' tokens went with hindsight."""
    common = full.steps.keys() & base.steps.keys()
    sends = [k for k in common if full.steps[k][0]]
    silent = [k for k in common if not full.steps[k][0]]

    def accepted(rec: Recorder, keys) -> float:
        return float(np.mean([rec.steps[k][1] for k in keys])) if keys else 0.0

    took = np.array([base.steps[k][1] for k in silent], dtype=int)
    # full's candidates cut to the length the baseline sent there: had the tokens been sent
    # as the baseline sent its own, how many would have been accepted
    cut = sum(max((accepted_prefix(c[: len(base.drafts[k])], full.outputs[k[0]][k[1]:])
                   for c in full.silent_candidates[k]), default=0) for k in silent)
    return {
        "aligned_positions": len(common),
        "full_drafts": {"steps": len(sends), "full_accepted_per_step": accepted(full, sends),
                        "base_accepted_per_step": accepted(base, sends)},
        "full_sends_nothing": {
            "steps": len(silent), "base_accepted_per_step": accepted(base, silent),
            "base_took": {"0": int((took == 0).sum()), "1": int((took == 1).sum()),
                          "2+": int((took >= 2).sum())},
            "base_sent": sum(len(base.drafts[k]) for k in silent),
            "base_accepted": int(took.sum()), "full_candidates_at_base_length": cut},
        "passed_over_calibration": by_band(full.passed_over, "first_token_right"),
        "hindsight": full.hindsight,
        "sent_reach": {f"{kind}/{where}": by_band(pairs, "reached")
                       for (kind, where), pairs in sorted(full.reach.items())},
        "scored_calibration": {"/".join(key): by_band(pairs, "accepted")
                               for key, pairs in sorted(full.scored.items())},
    }


SILENT_PRICES = (0.28, 0.24, 0.2, 0.16, 0.12)


def silent_sends(full: Recorder, lam: float, prices=SILENT_PRICES) -> list[dict]:
    """What sending drafts at the steps `full` sent nothing at would have done, per price:
    at each such step, its candidate with the most expected accepted tokens, sent while each
    token's predicted reach is at least the price, set against the steps the run took.

    A token gained there saves a step only where the run did not cover it within a step it
    took anyway: the run's steps that start inside the tokens gained are saved, with their
    drafts, less one where the gain ends inside a step of the run (a new step starts there and
    ends where that one did, drafting the rest of its draft). So `steps_saved` over
    `accepted` is what one token gained at such a step is worth, in steps."""
    starts: dict[str, set[int]] = {}
    for rid, at in full.steps:
        starts.setdefault(rid, set()).add(at)
    run_steps = len(full.steps)
    run_cost = run_steps + lam * sum(drafted for drafted, _ in full.steps.values())
    rows = []
    for price in prices:
        sends = sent = gained = saved = 0
        for (rid, at), (tokens, reach) in full.silent_best.items():
            n = int(np.cumprod(reach >= price).sum())
            if not n:
                continue
            output = full.outputs[rid]
            gain = min(accepted_prefix(tokens[:n], output[at:]), len(output) - at - 1)
            sends, sent, gained = sends + 1, sent + n, gained + gain
            skipped = [s for s in range(at + 1, at + gain + 1) if s in starts[rid]]
            saved += len(skipped)
            sent -= sum(full.steps[(rid, s)][0] for s in skipped)
            end = at + gain + 1
            if skipped and end not in starts[rid] and end < len(output):
                saved -= 1
                sent += max(0, full.steps[(rid, skipped[-1])][0] - (end - skipped[-1]))
        cost = run_cost - saved + lam * sent
        rows.append({"price": price, "steps_sending": sends, "accepted": gained,
                     "steps_saved": saved, "draft_tokens_added": sent,
                     "al_ratio": round(run_steps / (run_steps - saved), 4),
                     "speedup_ratio": round(run_cost / cost, 4)})
    return rows


def frontier(run, base: Meter, full: Meter, plans: list[float], batch: int, lam: float
             ) -> list[dict]:
    """`full` planned for each draft price in `plans`, priced at `lam`: per plan, its AL,
    rejected draft tokens per output token and modeled speedup, and their ratios to the
    baseline's. The first rows: the baseline, and `full` planned for `lam`, as measured."""
    plain = replay(run.tokenized, make_drafter("plain", run.setup), batch=batch)

    def row(meter, plan) -> dict:
        rep = meter.report(plain, [lam])
        return {"plan_lambda": plan, "al": rep["al"],
                "rejected_per_token": rep["rejected_per_token"],
                "speedup": rep["modeled_speedup"][str(lam)]}

    rows = [row(base, None), row(full, lam)]
    for plan in plans:
        # only the plan's price moves: the past outputs and the served split stay the run's
        setup = dataclasses.replace(run.setup, lam=plan)
        rows.append(row(replay(run.tokenized, make_drafter("full", setup), batch=batch), plan))
    for r in rows[1:]:
        r["al_ratio"] = round(r["al"] / rows[0]["al"], 4)
        r["speedup_ratio"] = round(r["speedup"] / rows[0]["speedup"], 4)
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_replay_options(ap, sessions=20)
    ap.add_argument("--base", default="suffix", help="the method full is set beside")
    ap.add_argument("--frontier", default="",
                    help="comma-separated draft prices to plan full for (see above)")
    args = ap.parse_args(argv)
    try:
        plans = [float(x) for x in args.frontier.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--frontier {args.frontier!r}: not a comma-separated list of numbers")
    run = load_replay(args, f"full,{args.base}")
    full, base = (Recorder(make_drafter(name, run.setup)) for name in ("full", args.base))
    full_meter, base_meter = (replay(run.tokenized, rec, batch=args.batch) for rec in (full, base))
    report = {"traces": [str(t) for t in args.traces], "sessions": len(run.tokenized),
              "seed": args.seed, "batch": args.batch, "lambda": args.lam, "base": args.base,
              **compare(full, base)}
    report["silent_sends"] = silent_sends(full, args.lam)
    if plans:
        report["frontier"] = frontier(run, base_meter, full_meter, plans, args.batch, args.lam)
    d, s = report["full_drafts"], report["full_sends_nothing"]
    print(f"{report['aligned_positions']} output positions where both methods start a step")
    print(f"full drafts at {d['steps']}: accepted a step, full {d['full_accepted_per_step']:.3f}"
          f", {args.base} {d['base_accepted_per_step']:.3f}")
    print(f"full sends nothing at {s['steps']}: {args.base} accepted "
          f"{s['base_accepted_per_step']:.3f} a step (took 0 / 1 / 2+ tokens: "
          f"{s['base_took']['0']} / {s['base_took']['1']} / {s['base_took']['2+']})")
    print(f"  there {args.base} sent {s['base_sent']} draft tokens and had {s['base_accepted']}"
          f" accepted; full's candidates, cut to the same lengths, would have had "
          f"{s['full_candidates_at_base_length']}")
    print("full's candidates there, by predicted first-token probability:")
    for b in report["passed_over_calibration"]:
        print(f"  [{b['band'][0]:.1f}, {b['band'][1]:.1f}]: {b['candidates']:6d} candidates, "
              f"predicted {b['predicted']:.3f}, right {b['first_token_right']:.3f}")
    h = report["hindsight"]
    print(f"full's candidates, set against the rest of each output: {h['accepted']} tokens "
          f"accepted; {h['sent_ran_on']} more written after sent drafts that stopped short; "
          f"{h['rival_went_further']} more held by a candidate passed over; "
          f"{h['sending_nothing']} held where nothing was sent")
    print("sending full's best candidate where it sent nothing, while each token's predicted"
          " reach is at least the price (set against the run's own steps):")
    for r in report["silent_sends"]:
        print(f"  {r['price']:.2f}: {r['steps_sending']} steps send, {r['accepted']} tokens "
              f"accepted, {r['steps_saved']} steps saved, {r['draft_tokens_added']} draft tokens "
              f"more; AL {r['al_ratio']:.4f}x, λ{args.lam} speedup {r['speedup_ratio']:.4f}x")
    print_bands("sent drafts, each token's predicted probability of being reached, by band "
                "(inside the draft; the three positions after it):",
                report["sent_reach"], "reached")
    print_bands("every candidate's scored positions, the predicted probability that the token "
                "is accepted once the ones before it were, by band:",
                report["scored_calibration"], "accepted")
    for r in report.get("frontier", []):
        who = args.base if r["plan_lambda"] is None else f"full planned for λ{r['plan_lambda']}"
        ratios = "" if r["plan_lambda"] is None else \
            f"  ({r['al_ratio']:.3f}x / {r['speedup_ratio']:.3f}x {args.base}'s)"
        print(f"{who:28s} AL {r['al']:.3f}, rejected {r['rejected_per_token']:.3f}, "
              f"λ{args.lam} speedup {r['speedup']:.3f}{ratios}")
    return saved(args, report)


if __name__ == "__main__":
    main()
