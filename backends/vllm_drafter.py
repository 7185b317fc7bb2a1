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
server's `vllm_xargs`) and finished requests are only known to the runner, so `register()`
wraps two runner methods to hand them over. The constructor calls it, because vLLM builds
the proposer in the process that runs the model; it is also the `vllm.general_plugins`
entry point.

Per-request metadata, as flat `vllm_xargs` keys (all optional):
    agentspec_session    session key: requests of one session share S, W and block history
                         (default: a session of the request's own)
    agentspec_agent      agent id            agentspec_query   query id
    agentspec_role       role (default "agent")
    agentspec_structure  delimiter pairs as a JSON string, e.g. '[["```", "```"]]'
A bad value is ignored for that request only, with a warning. With AGENTSPEC_VLLM_STATS set
to a file path, the drafter's counts are written there as JSON after every finished request.

This module imports vllm lazily (only `register` needs it), agentspec.policy (numba) only
when a proposer is built, and never torch.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from agentspec.drafter import PROMPT, Request
from agentspec.structure import StructureError, parse_structure, token_bytes

# agentspec.policy is imported only when a proposer is built: it loads numba, and vLLM's CPU
# worker fails to register its kernels when llvmlite is already loaded at plugin-load time
# (`'_lib_fn_wrapper' object has no attribute 'get'` in vllm/triton_utils/dispatcher.py).

log = logging.getLogger("agentspec.vllm")

PREFIX = "agentspec_"
TEXT_KEYS = ("session", "agent", "query", "role")
STATS_ENV = "AGENTSPEC_VLLM_STATS"  # a file path: the drafter's counts, rewritten per finish


def request_meta(req_id: str, extra_args: dict | None) -> tuple[dict, list[str]]:
    """Request fields from `extra_args`: (fields, warnings). Bad values are left out."""
    args = extra_args or {}
    fields: dict[str, Any] = {"session": f"request:{req_id}", "role": "agent", "agent": "",
                              "query": req_id, "structure": ()}
    problems = []
    for key in TEXT_KEYS:
        value = args.get(PREFIX + key)
        if value is None:
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            fields[key] = str(value)
        else:
            problems.append(f"{PREFIX}{key}={value!r} ignored: not a non-empty string")
    value = args.get(PREFIX + "structure")
    if value is not None:
        try:
            if not isinstance(value, str):
                raise StructureError("not a JSON string")
            fields["structure"] = parse_structure(value)
        except StructureError as e:
            problems.append(f"{PREFIX}structure ignored: {e}")
    return fields, [f"request {req_id}: {p}" for p in problems]


def _tokenizer(path: str | None):
    """The model's `tokenizers.Tokenizer` when its folder has tokenizer.json, else None."""
    if not path or not (Path(path) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class AgentspecProposer:
    """Drives `agentspec.policy.Policy` (the "full" rung) from vLLM's model runner."""

    def __init__(self, vllm_config, policy=None):
        from agentspec.policy import Policy, ladder

        register()
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(model.max_model_len)
        if policy is None:
            tok = _tokenizer(getattr(model, "tokenizer", None) or model.model)
            policy = Policy(ladder()["full"],
                            encode=(lambda s: tok.encode(s, add_special_tokens=False).ids)
                            if tok else None,
                            decode=(lambda ids: tok.decode(ids, skip_special_tokens=False))
                            if tok else None,
                            token_bytes=token_bytes(tok) if tok else None)
        self.policy = policy
        self.runner = None  # set by the hook around propose_draft_token_ids
        self.scheduled: dict[str, list[int]] = {}  # drafts vLLM verified this step
        self.requests: dict[str, Request] = {}
        self.drafted: dict[str, int] = {}  # request id -> length of its last draft
        self.last_prompt: dict[str, list[int]] = {}  # session -> prompt last registered
        self.stats = {"propose_calls": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0,
                      "started": 0, "finished": 0, "propose_s": 0.0}

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
        self.stats["propose_calls"] += 1
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.runner is None:  # hooks missing: draft nothing rather than guess ids
            return drafts
        req_ids = self.runner.input_batch.req_ids
        rows, batch = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk, or a discarded row: no new tokens
                continue
            n = int(num_tokens_no_spec[i])
            req = self._update(req_ids[i], sampled, token_ids_cpu[i], n)
            if n + 1 < self.max_model_len:
                rows.append((i, n))
                batch.append(req)
        for (i, n), req, draft in zip(rows, batch, self.policy.propose(batch)):
            draft = [int(t) for t in draft[:min(self.k, self.max_model_len - n - 1)]]
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

    def finish(self, req_id: str, req_state=None) -> None:
        req = self.requests.pop(req_id, None)
        self.drafted.pop(req_id, None)
        if req is None:
            return
        output = getattr(req_state, "output_token_ids", None)
        if output is not None and len(output) >= len(req.output):
            req.tokens = req.tokens[:req.num_prompt] + [int(t) for t in output]
        self.policy.finish(req)
        self.stats["finished"] += 1
        if req.session == f"request:{req.id}":  # a session of its own: nothing will reuse it
            self.policy.drop_session(req.session)
            self.last_prompt.pop(req.session, None)
        path = os.environ.get(STATS_ENV)
        if path:  # the drafter runs in vLLM's engine process: tests read its counts here
            Path(path).write_text(json.dumps(self.stats))

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
        fields, problems = request_meta(req_id, getattr(params, "extra_args", None))
        for p in problems:
            log.warning("agentspec: %s", p)
        prompt = list(getattr(state, "prompt_token_ids", None) or [])
        num_prompt = len(prompt) if 0 < len(prompt) <= n else max(0, n - 1)
        req = Request(id=req_id, tokens=[int(t) for t in row[:n]], num_prompt=num_prompt,
                      **fields)
        prompt = req.tokens[:num_prompt]
        # calls of one session repeat their history: register only what is new
        seen = self.last_prompt.get(req.session, [])
        new = prompt[_common_prefix(seen, prompt):]
        if new:
            self.policy.register(req.session, PROMPT, new)
        self.last_prompt[req.session] = prompt
        self.policy.start(req)
        self.requests[req_id] = req
        self.stats["started"] += 1
        return req

    def _flush_warnings(self) -> None:
        while self.policy.warnings:
            log.warning("agentspec: %s", self.policy.warnings.pop(0))


_HOOKED = False


def register() -> None:
    """Wrap vLLM's model runner so an `AgentspecProposer` sees request ids, per-request
    `extra_args` and finished requests. Idempotent; harmless for other drafters. This is
    the `vllm.general_plugins` entry point."""
    global _HOOKED
    if _HOOKED:
        return
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # no vLLM here (unit tests drive the proposer with a fake runner)
        return

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
