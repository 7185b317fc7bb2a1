"""The engine of `agentspec serve`: one thread owns the MLX model and runs the batched loop.

MLX arrays and streams belong to the thread that made them, so this thread loads the
model, measures the cost profile on first use, and then runs agentspec.speculation's loop
over a `Rows` target: requests in flight decode in one verification step (each row its own
draft and rollback) and join or leave between steps, up to `max_batch`. A joining request
starts from the longest cached prefix of its prompt (`PromptCache`) and prefills the rest.
The HTTP front submits `Job`s and gets each job's tokens back through its `emit` callback.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Callable

from agentspec.backends import mlx as engine  # loads OpenBLAS before MLX
from agentspec.backends.prompt_cache import PromptCache
from agentspec.drafter import Plain, Request
from agentspec.sessions import SessionBook
from agentspec.speculation import Loop, Row
from agentspec.state import Identity, Keeper, StateError, check, vocabulary_digest

log = logging.getLogger("agentspec.serve")


@dataclass
class Job:
    """One request for the engine. `emit(kind, value)` is called from the engine thread:
    ("tokens", [ids]) as they are accepted, then ("done", finish reason) or ("error", text)."""

    request: Request
    max_tokens: int
    emit: Callable[[str, object], None]
    stop_ids: frozenset = frozenset()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    files: dict = field(default_factory=dict)
    cancelled: bool = False  # set by the front: the client left or a stop string matched
    submitted: float = field(default_factory=perf_counter)
    first_token: float | None = None


@dataclass
class Metrics:
    """Counters for /metrics (written by the engine thread, read by the front)."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    cache_hits: int = 0
    cache_hit_tokens: int = 0
    cache_misses: int = 0
    ttft_seconds: float = 0.0
    ttft_count: int = 0


@dataclass
class EngineConfig:
    model: str | None = None
    dtype: str = "float32"
    method: str = "full"
    max_batch: int = 8
    cache_bytes: int = 2 << 30
    max_sessions: int = 64
    cost_profile: str | None = None  # a profile file; None: the machine's, measured if missing
    state: str | None = None  # where the drafter's learning is kept across runs; None: nowhere



class ServeEngine:
    def __init__(self, config: EngineConfig, say: Callable[[str], None] = print):
        self.config, self.say = config, say
        self.inbox: queue.Queue[Job] = queue.Queue()
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.error: str | None = None
        self.eng: engine.Engine | None = None
        self._stop = False
        self.keeper: Keeper | None = None  # keeps the drafter's state in config.state
        self.thread = threading.Thread(target=self._main, name="agentspec-engine", daemon=True)

    # --- front side ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread and wait until the model is loaded (raises MLXError if not)."""
        self.thread.start()
        self.ready.wait()
        if self.error:
            raise engine.MLXError(self.error)

    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    def stop(self) -> None:
        """Stop the engine thread, which saves the drafter's state as it ends."""
        self._stop = True
        if self.thread.is_alive():
            self.thread.join(timeout=60)

    # --- engine thread ------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._load()
        except Exception as e:  # anything the load raises ends the server with one line
            self.error = str(e) if isinstance(e, (engine.MLXError, StateError)) \
                else f"{type(e).__name__}: {e}"
            self.ready.set()
            return
        self.ready.set()
        while not self._stop:
            self._admit()
            if not self.loop.rows:
                continue
            try:
                self._step()
            except Exception as e:  # fail the rows in flight, keep serving the next ones
                log.error("agentspec serve: step failed: %s: %s", type(e).__name__, e)
                for r in self.loop.rows:
                    self.jobs.pop(id(r)).emit("error", f"generation failed: {e}")
                self.target = engine.Rows(self.eng.model, self.eng.plan)
                self.loop = Loop(self.target, self.drafter, on_finish=self._finished)
        if self.keeper is not None and self.keeper.close():
            self.say(f"kept what {self.config.method} learned in {self.keeper.path}")

    def _load(self) -> None:
        from agentspec.bench import make_drafter

        c = self.config
        self.eng = engine.load(c.model, c.dtype)
        if self.eng.plan.mode == "none" or self.eng.plan.reason:
            self.say(f"warning: {self.eng.plan.reason}")
        self.drafter, encode = None, None
        if c.method != "plain":
            setup = serve_setup(self.eng, c, self.say)
            self.drafter = make_drafter(c.method, setup)
            encode = setup.tokenizer.encode
            self._keep_state(setup)
        # plain serving tells sessions apart too: /metrics counts them for either method
        self.book = SessionBook(self.drafter if self.drafter is not None else Plain(),
                                c.max_sessions, encode)
        if not engine.batchable(self.eng.model, self.eng.plan, 0):
            raise engine.MLXError("serve needs a model whose layers all keep a plain KV cache "
                                  "(this one has sliding-window or recurrent layers)")
        self.jobs: dict[int, Job] = {}  # id(row) -> its job, while the row is in flight
        self.target = engine.Rows(self.eng.model, self.eng.plan)
        self.loop = Loop(self.target, self.drafter, on_finish=self._finished)
        self.cache = PromptCache(c.cache_bytes)

    def _keep_state(self, setup) -> None:
        """Take back what the drafter learned in earlier runs (config.state), and keep it
        (a method that learns nothing has nothing to keep)."""
        path, method = self.config.state, self.config.method
        if path is None or not self.drafter.state():
            return
        self.keeper = Keeper(path, self.drafter, Identity(method, self.eng.name,
                                                          vocabulary_digest(setup.token_bytes)))
        saved, warnings = self.keeper.start()
        for warning in warnings:
            self.say(f"warning: {warning}")
        self.say(f"resumed what {method} learned, from {path} (saved {saved})" if saved
                 else f"keeping what {method} learns in {path}")

    def _admit(self) -> None:
        room = self.config.max_batch - len(self.loop.rows)
        joining = []
        while room > len(joining):
            try:
                job = self.inbox.get(timeout=0.2) if not (self.loop.rows or joining) \
                    else self.inbox.get_nowait()
            except queue.Empty:
                break
            if job.cancelled:
                continue
            try:
                joining.append(self._row(job))
            except Exception as e:  # a request the model cannot take fails alone
                job.emit("error", str(e) if isinstance(e, engine.MLXError) else repr(e))
        self.loop.join(joining)

    def _row(self, job: Job) -> Row:
        """The job's row, its cache filled from the prompt cache and a prefill of the rest."""
        prompt = job.request.tokens
        cache, hit = self.cache.fetch(prompt[:-1])
        m = self.metrics
        m.requests += 1
        m.prompt_tokens += len(prompt)
        if hit:
            m.cache_hits += 1
            m.cache_hit_tokens += hit
        else:
            m.cache_misses += 1
            cache = self.eng.plan.make(self.eng.model)
        engine.prefill(self.eng.model, prompt[hit:-1], cache, plan=self.eng.plan)
        self.book.begin(job.request, job.files)
        row = Row(job.request, job.max_tokens, job.stop_ids, pending=prompt[-1],
                  temperature=job.temperature, top_p=job.top_p, seed=job.seed, state=cache)
        self.jobs[id(row)] = job
        return row

    def _step(self) -> None:
        rows = list(self.loop.rows)
        jobs = {id(r): self.jobs[id(r)] for r in rows}
        done = [len(r.tokens) for r in rows]
        m = self.metrics
        m.steps += 1
        m.batch_sizes[len(rows)] += 1
        self.loop.step()
        for r, before in zip(rows, done):
            job = jobs[id(r)]
            drafted, accepted = r.steps[-1][1], r.steps[-1][2]
            m.draft_tokens += drafted
            m.accepted_tokens += accepted
            m.generated_tokens += len(r.tokens) - before
            if len(r.tokens) > before:
                if job.first_token is None:
                    job.first_token = perf_counter()
                    m.ttft_seconds += job.first_token - job.submitted
                    m.ttft_count += 1
                job.emit("tokens", r.tokens[before:])
            if r.finish:
                job.emit("done", r.finish)
                del self.jobs[id(r)]
        gone = [r for r in self.loop.rows if jobs[id(r)].cancelled]
        if gone:
            self._drop(gone)
        if self.drafter is not None:
            while getattr(self.drafter, "warnings", None):
                log.warning("agentspec: %s", self.drafter.warnings.pop(0))

    def _finished(self, row: Row) -> None:
        """Keep the row's cache for later requests; the session remembers its output."""
        j = self.loop.rows.index(row)
        layers = self.target.extract(j)
        held = min(layers[0].offset, len(row.request.tokens))
        self.cache.store(row.request.tokens[:held], layers)
        self.book.end(row.request)
        if self.keeper is not None:
            self.keeper.finished(idle=len(self.loop.rows) == 1)  # (this row is the last)

    def _drop(self, rows: list[Row]) -> None:
        for r in rows:
            self._finished(r)
            self.jobs.pop(id(r)).emit("done", "cancelled")
        self.loop.drop(rows)


def serve_setup(eng: "engine.Engine", config: EngineConfig, say: Callable[[str], None]):
    """What the drafter knows: the tokenizer and this machine's cost profile (measured once,
    after a --state file that could not be taken back has failed the start)."""
    from agentspec.backends import mlx_probe
    from agentspec.bench import BenchSetup
    from agentspec.costs import load_profile
    from agentspec.structure import token_bytes
    from agentspec.tokens import ChatTokenizer

    tok = ChatTokenizer.from_model(Path(eng.path))
    vocabulary = token_bytes(tok.tokenizer)
    if config.state is not None:  # a file that cannot be taken back fails before a measurement
        check(config.state, Identity(config.method, eng.name, vocabulary_digest(vocabulary)))
    path = config.cost_profile or mlx_probe.default_profile("mlx", config.model, config.dtype)
    if path is None:
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= config.max_batch]
        say(f"no cost profile for this machine and model yet: measuring one at batch "
            f"{','.join(map(str, sizes))} (once; `agentspec profile-lambda` does it too)")
        # fewer repeats than profile-lambda: a first request should not wait long for it
        prof = mlx_probe.profile(eng, sizes, context=min(1024, (eng.context or 4096) // 2),
                                 repeats=3)
        path = mlx_probe.profile_path("mlx", config.model, config.dtype)
        prof.save(path)
        say(f"cost profile written to {path}")
    profile = load_profile(path)
    # lambda(b) of the profile at every batch size (BenchSetup.lam_at)
    return BenchSetup(tokenizer=tok, token_bytes=vocabulary, profile=profile)
