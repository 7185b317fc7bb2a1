"""agentspec as a vLLM drafter: `speculative_config={"method": "custom_class", ...}`.

    LLM(model, speculative_config={
        "method": "custom_class",
        "model": "agentspec.backends.vllm_drafter.AgentspecProposer",
        "num_speculative_tokens": 16})

vLLM builds the proposer inside its model runner with `AgentspecProposer(vllm_config)`,
calls `load_model(model)` once, then after every step
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` with one
row per request of the runner's input batch; it returns one draft (a possibly empty list
of token ids) per row. Request ids, prompts, `sampling_params.extra_args` (the OpenAI
server's `vllm_xargs`) and finished requests are only known to the runner, so the proposer
wraps two runner methods to hand them over (`hook_runner`). The constructor calls it,
because vLLM builds the proposer in the process that runs the model, and stops the engine
with a message when this vLLM is outside the tested range (the `vllm` extra) or its runner
lacks a hooked method; `register`, the `vllm.general_plugins` entry point, only warns.

Per-request metadata, as flat `vllm_xargs` keys (all optional):
    agentspec_session    session key: requests of one session share S, W and block history
                         (default: inferred from the prompt, as `agentspec serve` does:
                         the session whose first prompt this one continues, see
                         agentspec.sessions)
    agentspec_agent      agent id            agentspec_query   query id
    agentspec_role       role (default "agent")
    agentspec_structure  delimiter pairs as a JSON string, e.g. '[["```", "```"]]'
    agentspec_files      workspace files opened before this call, as a JSON string
                         {"path": "full text"}; each joins the session's W corpus once
A bad value is ignored for that request only, with a warning.

Environment of the engine process:
    AGENTSPEC_VLLM_METHOD   the policy to run (agentspec.bench.policy_names), default "full"
    AGENTSPEC_VLLM_SETUP    a JSON file of what the policy may know beyond its requests
                            (full-cold takes only the lambda and the cost profile):
                            {"lambda": 0.2, "cost_profile": PATH, "kmax": PATH,
                             "global_seed": [[token ids of past outputs], ...]} (all optional)
    AGENTSPEC_MAX_SESSIONS  sessions kept (default 64); the least recently used one without a
                            running request is dropped first
    AGENTSPEC_VLLM_STATS    a file path: the drafter's counts, rewritten as JSON per finish
    AGENTSPEC_VLLM_STATE    a file path (agentspec.state/4): what the policy learned, taken
                            back when the engine starts, saved every 16 finished requests
                            and whenever no request is left running

This module imports vllm lazily (only `hook_runner` needs it), agentspec.policy (numba) only
when a proposer is built, and never torch.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from agentspec.drafter import PROMPT, Request
from agentspec.learned_costs import TERMS
from agentspec.sessions import PREFIX, SessionBook, request_files, request_meta
from agentspec.state import Identity, Keeper, vocabulary_digest
from agentspec.structure import token_bytes

# agentspec.policy is imported only when a proposer is built: it loads numba, and vLLM's CPU
# worker fails to register its kernels when llvmlite is already loaded at plugin-load time
# (`'_lib_fn_wrapper' object has no attribute 'get'` in vllm/triton_utils/dispatcher.py).

log = logging.getLogger("agentspec.vllm")

STATS_ENV = "AGENTSPEC_VLLM_STATS"
STATE_ENV = "AGENTSPEC_VLLM_STATE"
METHOD_ENV = "AGENTSPEC_VLLM_METHOD"
SETUP_ENV = "AGENTSPEC_VLLM_SETUP"
MAX_SESSIONS_ENV = "AGENTSPEC_MAX_SESSIONS"


def load_setup(path: str | None, tok, model: str | None = None, dtype: str | None = None):
    """A BenchSetup from the AGENTSPEC_VLLM_SETUP file (see the module docstring). Without
    a cost profile there, the one `profile-lambda --backend vllm` cached for this machine
    and model; without either, lambda 0.2 with a warning."""
    from agentspec.bench import DEFAULT_LAMBDA, BenchSetup
    from agentspec.controller import load_kmax
    from agentspec.costs import host_profile_path, load_profile
    from agentspec.tokens import PLAIN, ChatTokenizer

    setup = BenchSetup(tokenizer=ChatTokenizer(tok, PLAIN) if tok else None,
                       token_bytes=token_bytes(tok) if tok else None)
    given = json.loads(Path(path).read_text()) if path else {}
    if given.get("lambda") is not None:
        setup.lam = float(given["lambda"])
    profile = given.get("cost_profile")
    if not profile and setup.lam is None:
        # profiles are cached by the dtype asked for: this engine's, else vLLM's default
        cached = [p for p in (host_profile_path("vllm", model, dtype),
                              host_profile_path("vllm", model, None)) if p.is_file()]
        if cached:
            profile = str(cached[0])
            log.info("agentspec: planning with this machine's cost profile %s", profile)
        else:
            log.warning("agentspec: no cost profile for this machine and model: planning with "
                        "lambda %s; run `agentspec profile-lambda --backend vllm --model %s` "
                        "once to plan with measured costs", DEFAULT_LAMBDA, model)
    setup.profile = load_profile(profile) if profile else None
    setup.kmax = load_kmax(given["kmax"]) if given.get("kmax") else None
    setup.global_seed = given.get("global_seed") or []
    return setup


def _dtype(model_config) -> str | None:
    """The engine's dtype as `--dtype` names it (None when unknown)."""
    dtype = getattr(model_config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _tokenizer(path: str | None):
    """The model's `tokenizers.Tokenizer` when its folder has tokenizer.json, else None."""
    if not path or not (Path(path) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


class AgentspecProposer:
    """Drives `agentspec.policy.Policy` (the policy $AGENTSPEC_VLLM_METHOD, default "full")
    from vLLM's model runner."""

    def __init__(self, vllm_config):
        from agentspec.bench import make_drafter, policy_names

        hook_runner()
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(model.max_model_len)
        rung = os.environ.get(METHOD_ENV) or "full"
        if rung not in policy_names():
            raise ValueError(f"{METHOD_ENV}={rung!r} is not an agentspec policy; choose from "
                             f"{', '.join(policy_names())}")
        setup = load_setup(os.environ.get(SETUP_ENV),
                           _tokenizer(getattr(model, "tokenizer", None) or model.model),
                           model.model, _dtype(model))
        self.encode = setup.tokenizer.encode if setup.tokenizer else None
        self.policy = make_drafter(rung, setup)
        self.book = SessionBook(self.policy, int(os.environ.get(MAX_SESSIONS_ENV) or 64),
                                self.encode)
        self.runner = None  # set by the hook around propose_draft_token_ids
        self.step_shape: list[int] | None = None  # see bind
        self.last_propose: float | None = None  # when propose was last called
        self.scheduled: dict[str, list[int]] = {}  # drafts vLLM verified this step
        self.requests: dict[str, Request] = {}
        self.drafted: dict[str, int] = {}  # request id -> length of its last draft
        self.max_output: dict[str, int] = {}  # request id -> its max_tokens
        self.stats = {"propose_calls": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0,
                      "started": 0, "finished": 0, "sessions": 0, "propose_s": 0.0,
                      "resumed": None}  # when the state taken back was saved
        self._keep_state(rung, str(model.model), setup.token_bytes)

    def _keep_state(self, rung: str, model: str, vocabulary) -> None:
        """Take back what the policy learned in earlier runs, and keep it
        ($AGENTSPEC_VLLM_STATE; a file it cannot take stops the engine with its one line)."""
        path = os.environ.get(STATE_ENV)
        self.keeper = None
        if not path:
            return
        self.keeper = Keeper(path, self.policy, Identity(
            rung, model, vocabulary_digest(vocabulary) if vocabulary else "unknown"))
        self.stats["resumed"], warnings = self.keeper.start()
        for warning in warnings:
            log.warning("agentspec: %s", warning)

    # --- called by vLLM --------------------------------------------------------------
    def load_model(self, *args, **kwargs) -> None:
        """No model: drafts come from text. Runs one throwaway request so the match engine
        is compiled (numba, seconds when its cache is cold) before the first real one."""
        warm = Request(id="agentspec:warmup", session="agentspec:warmup",
                       tokens=[1, 2, 3, 1, 2, 3, 1, 2], num_prompt=8)
        self.policy.register(warm.session, PROMPT, warm.tokens)
        self.policy.start(warm)
        warm.tokens.append(3)
        self.policy.propose([warm])
        del warm.tokens[warm.num_prompt:]  # no output: nothing joins the global corpus
        self.policy.finish(warm)
        self.policy.drop_session(warm.session)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec,
                token_ids_cpu, slot_mappings=None, **kwargs) -> list[list[int]]:
        t0 = time.perf_counter()
        if self.step_shape is not None and self.last_propose is not None:
            # propose to propose is one engine step, the one that verified our last drafts
            self.policy.observe_step(self.step_shape, t0 - self.last_propose)
        self.last_propose = t0
        self.stats["propose_calls"] += 1
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.runner is None:
            raise VllmContractError(
                "vLLM asked for drafts but its model runner never went through "
                f"{RUNNER_HOOKS[0]}, which agentspec hooks to learn request ids: this "
                "vLLM calls its drafter from elsewhere (see agentspec.backends.vllm_drafter)")
        req_ids = self.runner.input_batch.req_ids
        rows, batch = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk, or a discarded row: no new tokens
                continue
            n = int(num_tokens_no_spec[i])
            req = self._update(req_ids[i], sampled, token_ids_cpu[i], n)
            # a step gives at most draft + 1 tokens: no draft past the context or max_tokens
            room = min(self.k, self.max_model_len - n - 1,
                       self.max_output.get(req.id, self.max_model_len) - len(req.output) - 1)
            if room > 0:
                rows.append((i, room))
                batch.append(req)
        for (i, room), req, draft in zip(rows, batch, self.policy.propose(batch)):
            draft = [int(t) for t in draft[:room]]
            drafts[i] = draft
            if draft:
                self.drafted[req.id] = len(draft)
                self.stats["drafts"] += 1
                self.stats["draft_tokens"] += len(draft)
        self._flush_warnings()
        self.stats["propose_s"] += time.perf_counter() - t0
        return drafts

    # --- called by the runner hooks --------------------------------------------------
    def bind(self, runner, scheduler_output) -> None:
        self.runner = runner
        self.scheduled = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        # the draft length of each row of the step that just ran when it only decoded; a
        # step that prefilled too costs what its prompts cost and teaches nothing of drafts
        rows = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        verified = [len(self.scheduled.get(req_id, ())) for req_id in rows]
        total = getattr(scheduler_output, "total_num_scheduled_tokens", -1)
        self.step_shape = verified if rows and total == len(rows) + sum(verified) else None

    def finish(self, req_id: str, req_state=None) -> None:
        req = self.requests.pop(req_id, None)
        self.drafted.pop(req_id, None)
        self.max_output.pop(req_id, None)
        if req is None:
            return
        output = getattr(req_state, "output_token_ids", None)
        if output is not None and len(output) >= len(req.output):
            req.tokens = req.tokens[:req.num_prompt] + [int(t) for t in output]
        self.book.end(req)
        self.stats["finished"] += 1
        if self.keeper is not None:
            self.keeper.finished(idle=not self.requests)
        path = os.environ.get(STATS_ENV)
        if path:  # the drafter runs in vLLM's engine process: tests read its counts here
            coef = self.policy.costs.coef
            self.stats["learned_step_s"] = None if coef is None else dict(
                zip(TERMS, map(float, coef)))
            # whole or not at all: a reader polls the file while requests end
            Path(f"{path}.tmp").write_text(json.dumps(self.stats))
            os.replace(f"{path}.tmp", path)

    # --- internals -------------------------------------------------------------------
    def _update(self, req_id: str, sampled: list[int], row, n: int) -> Request:
        """The request with this step's tokens appended, observed against its last draft."""
        req = self.requests.get(req_id)
        if req is None:
            return self._start(req_id, row, n)
        if len(req.tokens) + len(sampled) == n:
            req.tokens.extend(int(t) for t in sampled)
        else:  # out of step (preemption, resumption): take the runner's copy
            req.tokens = [int(t) for t in row[:n]]
        drafted = self.drafted.pop(req_id, 0)
        if drafted:
            if req_id in self.scheduled:  # vLLM may have verified fewer than we drafted
                drafted = min(drafted, len(self.scheduled[req_id]))
            accepted = max(0, min(drafted, len(sampled) - 1))
            self.policy.observe(req, drafted, accepted)
            self.stats["accepted"] += accepted
        return req

    def _start(self, req_id: str, row, n: int) -> Request:
        state = self.runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        extra_args = getattr(params, "extra_args", None)
        fields, problems = request_meta(req_id, extra_args)
        files, bad_files = request_files(req_id, extra_args)
        for p in problems + bad_files:
            log.warning("agentspec: %s", p)
        prompt = list(getattr(state, "prompt_token_ids", None) or [])
        num_prompt = len(prompt) if 0 < len(prompt) <= n else max(0, n - 1)
        req = Request(id=req_id, tokens=[int(t) for t in row[:n]], num_prompt=num_prompt,
                      **fields)
        if files and self.encode is None:
            log.warning("agentspec: request %s: %sfiles ignored: the model folder has no "
                        "tokenizer.json", req_id, PREFIX)
        self.book.begin(req, files)
        self.requests[req_id] = req
        if isinstance(getattr(params, "max_tokens", None), int):
            self.max_output[req_id] = params.max_tokens
        self.stats["started"] += 1
        self.stats["sessions"] = self.book.sessions_started
        return req

    def _flush_warnings(self) -> None:
        while self.policy.warnings:
            log.warning("agentspec: %s", self.policy.warnings.pop(0))


# The model-runner methods `hook_runner` wraps: without them the proposer cannot tell which
# request a row is, nor when one ends.
RUNNER_HOOKS = ("propose_draft_token_ids", "_on_request_state_removed")


class VllmContractError(RuntimeError):
    """vLLM is not the version, or its runner not the shape, this drafter was tested with."""


def tested_vllm() -> str:
    """The vLLM versions this drafter is tested with: the `vllm` extra's range, as installed."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        wanted = requires("agentspec") or []
    except PackageNotFoundError:
        wanted = []
    for line in wanted:
        spec, _, marker = line.partition(";")
        if spec.strip().startswith("vllm") and "vllm" in marker:
            return spec.strip()[len("vllm"):].strip()
    raise VllmContractError("agentspec's package metadata names no `vllm` extra: reinstall "
                            "it (pip install -e '.[vllm]' or scripts/setup.sh)")


def check_vllm(version: str, runner_class) -> None:
    """Stop with a message naming what is wrong, instead of a drafter that drafts nothing."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    wanted = tested_vllm()
    try:
        fits = Version(version) in SpecifierSet(wanted)
    except InvalidVersion:
        fits = False
    if not fits:
        raise VllmContractError(f"vLLM {version} is not a version the agentspec drafter is "
                                f"tested with ({wanted}): install one that is, e.g. "
                                f"scripts/setup.sh")
    missing = [h for h in RUNNER_HOOKS if not callable(getattr(runner_class, h, None))]
    if missing:
        raise VllmContractError(f"vLLM {version}: {runner_class.__name__} has no "
                                f"{', '.join(missing)}, which the agentspec drafter hooks to "
                                f"see request ids and finished requests")


_HOOKED = False


def register() -> None:
    """The `vllm.general_plugins` entry point, which vLLM runs in every process of every
    engine, drafter or not: hook the runner, and when this vLLM does not fit, only warn
    (the proposer refuses to start; other engines run as usual)."""
    try:
        hook_runner()
    except VllmContractError as e:
        log.warning("agentspec: %s; the agentspec drafter will refuse to start", e)


def hook_runner() -> None:
    """Wrap vLLM's model runner so an `AgentspecProposer` sees request ids, per-request
    `extra_args` and finished requests. Idempotent; harmless for other drafters. Raises
    VllmContractError when the installed vLLM is outside the tested range or its runner
    lacks a hooked method."""
    global _HOOKED
    if _HOOKED:
        return
    try:
        import vllm
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # no vLLM here (unit tests drive the proposer with a fake runner)
        return
    check_vllm(vllm.__version__, GPUModelRunner)

    propose_draft_token_ids = GPUModelRunner.propose_draft_token_ids
    on_request_state_removed = GPUModelRunner._on_request_state_removed

    def propose_hook(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, AgentspecProposer):
            drafter.bind(self, scheduler_output)
        return propose_draft_token_ids(self, scheduler_output, *args, **kwargs)

    def removed_hook(self, req_id, req_state):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, AgentspecProposer):
            drafter.finish(req_id, req_state)
        return on_request_state_removed(self, req_id, req_state)

    GPUModelRunner.propose_draft_token_ids = propose_hook
    GPUModelRunner._on_request_state_removed = removed_hook
    _HOOKED = True
