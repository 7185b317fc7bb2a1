import time
from dataclasses import replace

import numpy as np
import pytest

from agentspec.replay import replay
from agentspec.bench import BenchSetup, make_drafter, needs_kmax, run_replay_bench
from agentspec.drafter import FILE, PROMPT, TOOL, Plain
from agentspec.kmax import profile_kmax
from agentspec.policy import ladder, output_lead
from agentspec.tokens import CHATML, PLAIN, ChatTokenizer, chat_format, tokenize_sessions
from agentspec.trace import parse_session
from conftest import CHATML as CHATML_TEMPLATE
from conftest import session_obj, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer(tiny_tokenizer(), CHATML)


def tokenized(tok, n=1, **kw):
    return tokenize_sessions([parse_session(session_obj(f"s{i}", **kw)) for i in range(n)], tok)


class Oracle(Plain):
    """Drafts the true continuation (it peeks at the target), k tokens at a time."""

    name = "oracle"

    def __init__(self, targets, k, wrong_tail=0):
        self.targets, self.k, self.wrong_tail = targets, k, wrong_tail

    def propose(self, batch, padded=False):
        drafts = []
        for r in batch:
            done = len(r.output)
            d = self.targets[r.id][done:done + self.k]
            drafts.append(list(d) + [-1] * self.wrong_tail)
        return drafts


class Recorder(Plain):
    def __init__(self):
        self.events = []

    def register(self, session, kind, tokens, path=""):
        self.events.append(("register", kind, path))

    def start(self, request):
        self.events.append(("start", request.id, request.role, request.turn))

    def finish(self, request):
        self.events.append(("finish", request.id, len(request.output)))

    def drop_session(self, session):
        self.events.append(("drop", session))


def test_chat_format_and_prompt_layout(tok):
    assert chat_format(CHATML_TEMPLATE) is CHATML and chat_format(None) is PLAIN
    (ts,) = tokenized(tok)
    s = ts.session
    first, second = ts.calls
    expected = "".join(CHATML.render(m["role"], m["content"]) for m in s.threads[0][:2])
    assert tok.decode(first.prompt.tolist()) == expected + CHATML.header
    assert tok.decode(first.output) == s.threads[0][2]["content"]
    # the second prompt shows the first output and the tool message; only the tool
    # message is new (the output reaches the drafter when its call finishes)
    assert [role for role, _ in second.new_messages] == ["tool"]
    assert [role for role, _ in first.new_messages] == ["system", "user"]
    assert first.prompt.dtype == np.int32


def test_plain_is_one_token_per_step(tok):
    sessions = tokenized(tok, 3)
    m = replay(sessions, Plain())
    total = sum(s.output_tokens for s in sessions)
    assert m.total.output_tokens == total == m.total.steps
    assert m.total.al == 1.0 and m.total.drafted == 0
    assert m.cost(0.5) == total


def test_oracle_drafts_are_accepted_and_modeled(tok):
    sessions = tokenized(tok, 2)
    targets = {f"{s.id}#{i}": c.output for s in sessions for i, c in enumerate(s.calls)}
    m = replay(sessions, Oracle(targets, k=4))
    assert m.total.output_tokens == sum(s.output_tokens for s in sessions)
    assert m.total.accepted == m.total.drafted  # never wrong
    assert 4.0 < m.total.al <= 5.0
    wrong = replay(sessions, Oracle(targets, k=4, wrong_tail=3))
    assert wrong.total.al == m.total.al
    assert wrong.total.drafted - wrong.total.accepted == 3 * wrong.total.steps
    plain = replay(sessions, Plain())
    assert len(plain.step_rows) / m.cost(0.0) == pytest.approx(m.total.al, rel=0.05)
    assert m.cost(0.2) < wrong.cost(0.2)


def test_outputs_generated_under_a_budget_get_no_draft_past_it(tok):
    # a backend cut each draft to what its --max-tokens left (a step gives draft + 1 tokens),
    # so replaying its outputs does; a recorded output ends where nothing says in advance
    sessions = tokenized(tok, 2)
    targets = {f"{s.id}#{i}": c.output for s in sessions for i, c in enumerate(s.calls)}
    wrong = Oracle(targets, k=0, wrong_tail=50)  # 50 wrong tokens a step
    assert replay(sessions, wrong).total.drafted == 50 * sum(s.output_tokens for s in sessions)
    budgeted = [replace(s, calls=[replace(c, max_tokens=len(c.output)) for c in s.calls])
                for s in sessions]
    m = replay(budgeted, wrong)
    lengths = [len(c.output) for s in sessions for c in s.calls]
    # the step at output position j has n - 1 - j tokens left to draft
    assert m.total.drafted == sum(min(50, n - 1 - j) for n in lengths for j in range(n))
    assert m.total.steps == m.total.output_tokens == sum(lengths)


def test_batch_lockstep_keeps_totals(tok):
    sessions = tokenized(tok, 5)
    one = replay(sessions, Plain(), batch=1)
    four = replay(sessions, Plain(), batch=4)
    assert four.total.output_tokens == one.total.output_tokens
    assert max(four.step_rows) == 4 and len(four.step_rows) < len(one.step_rows)
    # a fixed lambda costs each lockstep step once, whatever its rows
    assert four.cost(0.3) == len(four.step_rows)


def test_engine_calls_reach_the_drafter_in_order(tok):
    (ts,) = tokenized(tok)
    rec = Recorder()
    replay([ts], rec)
    kinds = [e[:2] for e in rec.events]
    assert kinds[0] == ("register", FILE)  # a file no call names is known from the start
    assert kinds[1:3] == [("register", PROMPT)] * 2
    assert kinds[3] == ("start", "s0#0")
    assert ("register", TOOL) in kinds
    assert rec.events[-1] == ("drop", "s0")
    finishes = [e for e in rec.events if e[0] == "finish"]
    assert [f[2] for f in finishes] == [len(c.output) for c in ts.calls]


class SlowStarts(Plain):
    """Spends ~5 ms of CPU time starting each call and nothing in its steps."""

    def start(self, request):
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass


def test_overhead_is_propose_and_observe_and_calls_are_apart(tok):
    # bench-json.md: overhead_us_per_step is propose + observe; the replay gives the time
    # spent in calls between steps (registering, starting, finishing them) beside it
    sessions = tokenized(tok, 2)
    meter = replay(sessions, SlowStarts())
    entry = meter.report(meter)
    calls = sum(len(s.calls) for s in sessions)
    assert entry["call_overhead_us_per_step"] * meter.total.steps >= 0.9 * 5000 * calls
    assert entry["overhead_us_per_step"] < entry["call_overhead_us_per_step"] / 10


def test_report_follows_bench_schema(tok):
    sessions = tokenized(tok, 2)
    seed = [sessions[0].calls[0].output]
    res = run_replay_bench(sessions, ["plain", "ngram", "suffix", "suffix-cold", "full",
                                      "full-cold"],
                           model="tiny", traces=["x.jsonl"], setup=BenchSetup(global_seed=seed))
    r = res.report
    assert r["format"] == "agentspec.bench/1" and r["backend"] == "replay"
    assert (r["sessions"], r["calls"], r["batch"]) == (2, 4, 1)
    for name, m in r["methods"].items():
        assert set(m) >= {"al", "rejected_per_token", "draft_per_step", "steps", "output_tokens",
                          "modeled_speedup", "tokens_per_s", "speedup", "identical_to_plain",
                          "overhead_us_per_step", "call_overhead_us_per_step", "by_role",
                          "knowledge"}
        assert set(m["modeled_speedup"]) == {"0.02", "0.1", "0.2", "0.5"}
        assert m["tokens_per_s"] is None and m["by_role"]["code"]["output_tokens"] > 0
    assert r["methods"]["plain"]["al"] == 1.0
    # every method that can use past outputs was given the same ones, and the report says so
    given = {name: m["knowledge"]["global_seed_outputs"] for name, m in r["methods"].items()}
    assert given == {"plain": 0, "ngram": 0, "suffix": 1, "suffix-cold": 0, "full": 1,
                     "full-cold": 0}
    # the second call repeats the first output: the suffix tree of past responses hits
    assert r["methods"]["suffix"]["al"] > 1.5


def test_policies_serve_the_profiling_split(tok):
    """Where the recorded outputs are the target's, the policies serve the profiling split
    before the measured sessions: G ends holding the outputs seeding would have put there
    (each after its prompt's last tokens, as a served output's document starts), the
    acceptance model has learned from their steps, and the report says which method served
    what; suffix gets the same outputs as its tree of responses."""
    held, measured = tokenized(tok, 3)[:2], tokenized(tok, 3)[2:]
    seed = [c.output for s in held for c in s.calls]
    seeded = make_drafter("full", BenchSetup(global_seed=seed))
    served = make_drafter("full", BenchSetup(global_seed=seed, served=held))
    assert [d.tolist() for d in seeded.g.documents()] == [o for o in seed if o]
    requests = [s.request(i) for s in held for i, c in enumerate(s.calls) if c.output]
    leads = [output_lead(r.tokens, r.num_prompt) for r in requests]
    assert [d.tolist() for d in served.g.documents()] == \
        [lead + o for lead, o in zip(leads, (o for o in seed if o))]
    assert served.global_seed_outputs == seeded.global_seed_outputs == len(seed) > 0
    assert (served.served_sessions, seeded.served_sessions) == (2, 0)
    assert not served.sessions and not served.running  # nothing of theirs left but G
    trials = [p.acceptance._tables("code")[0].sum() for p in (seeded, served)]
    assert trials[0] == 0 < trials[1]
    r = run_replay_bench(measured, ["suffix", "full"], model="tiny", traces=["x.jsonl"],
                         setup=BenchSetup(global_seed=seed, served=held)).report
    assert {name: m["knowledge"] for name, m in r["methods"].items()} == {
        "suffix": {"global_seed_outputs": len(seed), "served_sessions": 0, "kmax_profile": False},
        "full": {"global_seed_outputs": len(seed), "served_sessions": 2, "kmax_profile": False}}


def test_full_cold_takes_none_of_what_the_warm_methods_are_given(tok):
    """`full-cold` is `full` on a machine that has served nothing: offered past outputs,
    sessions to serve and a Kmax profile, it takes none of them (it drafts as `full` given
    nothing), keeps what describes the machine (its price), and its report says so."""
    held, measured = tokenized(tok, 3)[:2], tokenized(tok, 3)[2:]
    seed = [c.output for s in held for c in s.calls]
    kmax = profile_kmax(held, 0.3, ladder()["global"])
    offered = BenchSetup(global_seed=seed, served=held, kmax=kmax, lam=0.3)
    cold, bare = make_drafter("full-cold", offered), make_drafter("full", BenchSetup(lam=0.3))
    assert (cold.name, cold.config.lam) == ("full-cold", 0.3)
    ran = [replay(measured, d).total for d in (cold, bare, make_drafter("full", offered))]
    assert ran[0] == ran[1] != ran[2]
    r = run_replay_bench(measured, ["suffix-cold", "full", "full-cold"], model="tiny",
                         traces=["x.jsonl"], setup=offered).report
    assert {name: m["knowledge"] for name, m in r["methods"].items()} == {
        "suffix-cold": {"global_seed_outputs": 0, "served_sessions": 0, "kmax_profile": False},
        "full": {"global_seed_outputs": len(seed), "served_sessions": 2, "kmax_profile": False},
        "full-cold": {"global_seed_outputs": 0, "served_sessions": 0, "kmax_profile": False}}


def test_a_policy_that_serves_the_profiling_split_is_given_no_kmax_profile(tok):
    """Serving the profiling split teaches `full`'s acceptance model what a Kmax profile of
    the same sessions would start it from: served, `full` is not given the profile (it
    drafts as without one); seeded only (a real backend, where past outputs are another
    model's), it is. AgSpec's controller caps its drafts by the profile: it is given it
    either way, and a rung that reads neither is given it nowhere."""
    held, measured = tokenized(tok, 3)[:2], tokenized(tok, 3)[2:]
    seed = [c.output for s in held for c in s.calls]
    kmax = profile_kmax(held, 0.3, ladder()["global"])
    served = BenchSetup(global_seed=seed, served=held, kmax=kmax, lam=0.3)
    seeded = BenchSetup(global_seed=seed, kmax=kmax, lam=0.3)
    given = [make_drafter(name, setup).kmax_profile for name, setup in
             [("full", served), ("full", seeded), ("agspec", served), ("global", seeded)]]
    assert given == [False, True, True, False]
    without = BenchSetup(global_seed=seed, served=held, lam=0.3)
    assert replay(measured, make_drafter("full", served)).total == \
        replay(measured, make_drafter("full", without)).total
    # the bench profiles Kmax only where a method is given the profile
    assert [needs_kmax(names, setup) for names, setup in
            [(["suffix", "full"], served), (["full"], seeded), (["agspec"], served),
             (["full-cold", "global"], seeded)]] == [False, True, True, False]
