"""`agentspec serve`: an OpenAI-compatible HTTP front (Starlette on uvicorn) for ServeEngine.

Requests are parsed and tokenized here (the tokenizer is thread-safe), then handed to the
engine thread as `Job`s; each job's tokens come back through an asyncio queue and are
detokenized incrementally, cut at stop strings, and sent whole or as SSE chunks. Errors
are OpenAI's error JSON with one message; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agentspec.backends.mlx_serve import Job, ServeEngine
from agentspec.models import ModelError, chat_template, render_chat
from agentspec.drafter import Request
from agentspec.sessions import request_files, request_meta
from agentspec.tokens import ChatTokenizer

log = logging.getLogger("agentspec.serve")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (status, message, param,
                                                                       kind, code)

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": self.code}}, self.status)


@dataclass
class Sampling:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    stream: bool
    include_usage: bool


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ApiError(400, f"'{name}' must be {kind} from {low} to {high}, not {value!r}", name)
    return value


def parse_sampling(body: dict) -> Sampling:
    """The sampling parameters of a request body, validated."""
    n = _number(body, "n", 1, 1, 128, integer=True)
    if n != 1:
        raise ApiError(400, "'n' > 1 is not supported: send one request per completion", "n")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": limit}, "max_tokens", None, 1, 1 << 31, integer=True)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise ApiError(400, "'top_p' must be greater than 0", "top_p")
    seed = _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and len(stop) <= 4
            and all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 strings", "stop")
    stream = body.get("stream") or False
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise ApiError(400, "'stream' must be a boolean and 'stream_options' an object", "stream")
    return Sampling(max_tokens, float(temperature), float(top_p),
                    secrets.randbits(31) if seed is None else seed % (1 << 62), stop, stream,
                    bool(options.get("include_usage")))


def _content(message: dict) -> dict:
    """A message with its content as text (OpenAI content parts joined)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {**message, "content": content if content is not None else ""}


class TextStream:
    """Output text as tokens arrive: whole characters only, cut at the first stop string."""

    def __init__(self, tok: ChatTokenizer, stop: list[str]):
        self.tok, self.stop = tok, stop
        self.ids: list[int] = []
        self.sent = 0  # characters handed out
        self.text = ""
        self.stopped = False

    def add(self, ids: list[int]) -> str:
        """New text safe to send; sets `stopped` when a stop string appeared."""
        self.ids.extend(ids)
        text = self.tok.decode(self.ids)
        hold = len(text) - len(text.rstrip("\ufffd"))  # an incomplete UTF-8 character
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s)))
            if at >= 0:
                text, hold, self.stopped = text[:at], 0, True
        if not self.stopped and self.stop:  # a stop string may be starting at the end
            hold = max([hold] + [k for s in self.stop for k in range(1, len(s))
                                 if text.endswith(s[:k])])
        self.text = text
        end = max(self.sent, len(text) - hold)
        delta, self.sent = text[self.sent:end], end
        return delta

    def rest(self) -> str:
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta


class Api:
    """The routes, bound to one engine and its tokenizer."""

    def __init__(self, server: ServeEngine, names: list[str]):
        self.server = server
        self.path = Path(server.eng.path)
        self.tok = ChatTokenizer.from_model(self.path)
        self.names = names
        self.template = chat_template(self.path) or ""
        self.created = int(time.time())

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/metrics", self.metrics),
                  Route("/v1/chat/completions", self.chat, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"])]
        return Starlette(routes=routes, lifespan=self._lifespan, exception_handlers={
            ApiError: lambda r, e: e.response(),
            404: lambda r, e: ApiError(404, f"no route {r.url.path}", code="not_found").response(),
            405: lambda r, e: ApiError(405, f"{r.method} is not allowed on {r.url.path}").response(),
            Exception: self._crash})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        # the engine stops (and saves what its drafter learned) while uvicorn shuts down:
        # uvicorn then ends the process with the signal that stopped it
        yield
        await asyncio.to_thread(self.server.stop)

    async def _crash(self, request, exc) -> JSONResponse:
        log.error("agentspec serve: %s: %s", type(exc).__name__, exc)
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                        kind="server_error").response()

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": self.created, "owned_by": "agentspec"}
            for n in self.names]})

    async def metrics(self, request: HttpRequest) -> Response:
        return PlainTextResponse(prometheus(self.server), media_type="text/plain; version=0.0.4")

    async def chat(self, request: HttpRequest) -> Response:
        body = await self._body(request)
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects",
                           "messages")
        extra = {}
        if body.get("tools"):
            if "tools" not in self.template:
                raise ApiError(400, "this model's chat template does not support tools", "tools")
            extra["tools"] = body["tools"]
        try:
            text = render_chat(self.path, [_content(m) for m in messages], True, **extra)
        except ModelError as e:
            raise ApiError(400, str(e), "messages") from None
        return await self._generate(body, self.tok.encode(text), "chat")

    async def completions(self, request: HttpRequest) -> Response:
        body = await self._body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            ids = self.tok.encode(prompt)
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            ids = list(prompt)
        else:
            raise ApiError(400, "'prompt' must be one non-empty string or a list of token ids",
                           "prompt")
        return await self._generate(body, ids, "text")

    async def _body(self, request: HttpRequest) -> dict:
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model not in self.names:
            raise ApiError(404, f"model {model!r} is not served here; this server has: "
                           f"{', '.join(self.names)}", "model", code="model_not_found")
        return body

    def _job(self, body: dict, ids: list[int], sampling: Sampling, emit) -> Job:
        context = self.server.eng.context
        if context and len(ids) >= context:
            raise ApiError(400, f"the prompt has {len(ids)} tokens but this model's context is "
                           f"{context} tokens", "messages", code="context_length_exceeded")
        room = context - len(ids) if context else 1 << 31
        rid = f"cmpl-{secrets.token_hex(12)}"
        meta = {**(body.get("vllm_xargs") or {}), **(body.get("metadata") or {})}
        fields, problems = request_meta(rid, meta)
        files, bad = request_files(rid, meta)
        for p in problems + bad:
            log.warning("agentspec: %s", p)
        request = Request(id=rid, tokens=list(ids), num_prompt=len(ids), **fields)
        return Job(request, min(sampling.max_tokens or room, room), emit,
                   frozenset(self.server.eng.stop_ids), sampling.temperature, sampling.top_p,
                   sampling.seed, files)

    async def _generate(self, body: dict, ids: list[int], kind: str) -> Response:
        sampling = parse_sampling(body)
        if not isinstance(body.get("metadata") or {}, dict) or \
                not isinstance(body.get("vllm_xargs") or {}, dict):
            raise ApiError(400, "'metadata' and 'vllm_xargs' must be objects", "metadata")
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        job = self._job(body, ids, sampling,
                        lambda k, v: loop.call_soon_threadsafe(events.put_nowait, (k, v)))
        self.server.submit(job)
        reply = Reply(job, events, TextStream(self.tok, sampling.stop), kind,
                      body.get("model"), sampling.include_usage)
        if sampling.stream:
            return StreamingResponse(reply.sse(), media_type="text/event-stream")
        try:
            return JSONResponse(await reply.whole())
        finally:
            job.cancelled = True  # a client gone before the end frees its row


class Reply:
    """One job's answer, whole or as server-sent events."""

    def __init__(self, job: Job, events: asyncio.Queue, text: TextStream, kind: str,
                 model: str, include_usage: bool):
        self.job, self.events, self.text, self.kind = job, events, text, kind
        self.model, self.include_usage = model, include_usage
        self.id = job.request.id
        self.created = int(time.time())
        self.finish = None
        self.generated = 0

    async def deltas(self):
        """Text pieces as they are generated; sets `finish`."""
        while True:
            kind, value = await self.events.get()
            if kind == "error":
                raise ApiError(400, value)
            if kind == "done":
                self.finish = "stop" if value in ("stop", "cancelled") else value
                yield self.text.rest()
                return
            self.generated += len(value)
            delta = self.text.add(value)
            if self.text.stopped:
                self.job.cancelled = True
                self.finish = "stop"
                yield delta
                return
            if delta:
                yield delta

    def usage(self) -> dict:
        n = self.job.request.num_prompt
        return {"prompt_tokens": n, "completion_tokens": self.generated,
                "total_tokens": n + self.generated}

    def _choice(self, text: str, finish, stream: bool) -> dict:
        if self.kind == "text":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if stream:
            return {"index": 0, "delta": {"content": text} if text else {},
                    "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish}

    def _object(self, stream: bool) -> str:
        if self.kind == "text":
            return "text_completion"
        return "chat.completion.chunk" if stream else "chat.completion"

    def _frame(self, choices: list, usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": self._object(True), "created": self.created,
               "model": self.model, "choices": choices}
        if usage is not None or self.include_usage:
            out["usage"] = usage
        return out

    async def whole(self) -> dict:
        text = "".join([d async for d in self.deltas()])
        return {"id": self.id, "object": self._object(False), "created": self.created,
                "model": self.model, "choices": [self._choice(text, self.finish, False)],
                "usage": self.usage()}

    async def sse(self):
        try:
            if self.kind == "chat":
                first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}
                yield _event(self._frame([first]))
            try:
                async for delta in self.deltas():
                    if delta:
                        yield _event(self._frame([self._choice(delta, None, True)]))
            except ApiError as e:
                yield _event({"error": {"message": e.message, "type": e.kind}})
                return
            yield _event(self._frame([self._choice("", self.finish, True)]))
            if self.include_usage:
                yield _event(self._frame([], self.usage()))
            yield "data: [DONE]\n\n"
        finally:
            self.job.cancelled = True  # the client left mid-stream, or the answer is complete


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def prometheus(server: ServeEngine) -> str:
    """The engine's counters in Prometheus text format."""
    m = server.metrics
    lines = []

    def add(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP agentspec_{name} {help_}", f"# TYPE agentspec_{name} {kind}"])
        lines.extend(f"agentspec_{name}{labels} {value}" for labels, value in samples)

    add("requests_total", "counter", "Requests started.", [("", m.requests)])
    add("prompt_tokens_total", "counter", "Prompt tokens of started requests.",
        [("", m.prompt_tokens)])
    add("generated_tokens_total", "counter", "Tokens generated.", [("", m.generated_tokens)])
    add("draft_tokens_total", "counter", "Draft tokens verified.", [("", m.draft_tokens)])
    add("accepted_tokens_total", "counter", "Draft tokens accepted.", [("", m.accepted_tokens)])
    add("steps_total", "counter", "Verification steps.", [("", m.steps)])
    add("sessions_total", "counter", "Sessions started (named by agentspec_session, or "
        "inferred from the prompt a call continues).", [("", server.book.sessions_started)])
    add("batch_size_steps_total", "counter", "Steps by the number of rows they verified.",
        [(f'{{size="{b}"}}', n) for b, n in sorted(m.batch_sizes.items())])
    add("prompt_cache_hits_total", "counter", "Requests that reused a cached prompt prefix.",
        [("", m.cache_hits)])
    add("prompt_cache_misses_total", "counter", "Requests prefilled from scratch.",
        [("", m.cache_misses)])
    add("prompt_cache_hit_tokens_total", "counter", "Prompt tokens taken from the cache.",
        [("", m.cache_hit_tokens)])
    add("time_to_first_token_seconds", "summary", "From submission to the first token.",
        [("_sum", round(m.ttft_seconds, 6)), ("_count", m.ttft_count)])
    return "\n".join(lines) + "\n"
