"""serve, app: the OpenAI-compatible HTTP API on Starlette (a small, well-kept ASGI toolkit:
routing, streaming responses and client-disconnect handling, without a validation framework
the API does not need), served by uvicorn.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` as server-sent
events), ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus text) and the chat page at ``/``. Errors have OpenAI's body,
``{"error": {"message", "type", "param", "code"}}``, and never stop the server. Each route is
one named function below; ``create_app`` only lists them. A client that goes away, streaming or
not, has its sequences cancelled at once (their slots and cache blocks freed).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import Route

from ..llm.batch import BatchEngine, SamplingParams, StepOutput
from ..llm.tokenizer import TextStream
from .constrain import Constraint, ConstraintError, Vocabulary, grammar_for, tool_call_grammar
from .limits import RAW_SEND, Limits, LimitsMiddleware, error_body
from .metrics import Latencies, metric
from .runner import EngineDown, QueueFull, Runner
from .tools import (
    SYNTAXES,
    ToolChoice,
    call_syntax,
    check_tools,
    parse_tool_calls,
    read_tool_choice,
)

_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>",
                "<end_of_turn>", "<|end|>")
# The roles a message may have (OpenAI's)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# The default completion length of a request without max_tokens: OpenAI's 16 for completions;
# chat requests run to the end of the context (or the server's --max-tokens).
COMPLETIONS_DEFAULT_TOKENS = 16
# Deeper JSON than this is refused (a request's tool schemas nest a few levels; templates and
# grammars recurse on what they are given)
MAX_JSON_DEPTH = 64


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# -- request fields ------------------------------------------------------------------------------
def _get(body: dict, name: str, kind: type | tuple[type, ...], default: Any = None,
         check: Any = None, what: str = "") -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(v, bool) and bool not in kinds:
        raise APIError(f"'{name}' must be {what or kinds[0].__name__}, not a boolean",
                       param=name)
    if float in kinds and isinstance(v, int):
        v = float(v)
    if not isinstance(v, kinds):
        raise APIError(f"'{name}' must be {what or kinds[0].__name__}, not "
                       f"{type(v).__name__}", param=name)
    if check is not None and not check(v):
        raise APIError(f"'{name}' is out of range: {v!r} ({what})", param=name)
    return v


def _sampling(body: dict) -> tuple[SamplingParams, int]:
    """The sampling fields of a request, and how many choices (``n``)."""
    finite = math.isfinite
    p = SamplingParams(
        temperature=_get(body, "temperature", float, 1.0, lambda v: finite(v) and 0 <= v <= 2,
                         "a number in [0, 2]"),
        top_p=_get(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        top_k=_get(body, "top_k", int, 0, lambda v: v >= 0, "0 or more"),
        min_p=_get(body, "min_p", float, 0.0, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        repetition_penalty=_get(body, "repetition_penalty", float, 1.0,
                                lambda v: finite(v) and v > 0, "a positive number"),
        seed=_get(body, "seed", int, None),
        presence_penalty=_get(body, "presence_penalty", float, 0.0,
                              lambda v: finite(v) and -2 <= v <= 2, "a number in [-2, 2]"),
        frequency_penalty=_get(body, "frequency_penalty", float, 0.0,
                               lambda v: finite(v) and -2 <= v <= 2, "a number in [-2, 2]"),
        logit_bias=_logit_bias(body),
    )
    n = _get(body, "n", int, 1, lambda v: 1 <= v <= 16, "1 to 16")
    return p, n


def _logit_bias(body: dict) -> dict[int, float]:
    """``logit_bias``: {"token id": bias in [-100, 100]} (JSON keys are strings)."""
    raw = _get(body, "logit_bias", dict, {})
    out = {}
    for k, v in raw.items():
        if not (k.isascii() and k.isdigit()) or isinstance(v, bool) or \
                not isinstance(v, (int, float)) or not (math.isfinite(v) and -100 <= v <= 100):
            raise APIError(f"'logit_bias' maps token ids to numbers in [-100, 100]; "
                           f"{k!r}: {v!r} is not one", param="logit_bias")
        out[int(k)] = float(v)
    return out


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s) or len(s) > 4:
        raise APIError("'stop' must be a string or a list of up to 4 strings", param="stop")
    return [x for x in s if x]


def _check_tree(body: Any) -> None:
    """Refuse strings that are not text (a lone UTF-16 surrogate, which JSON's ``\\ud800``
    escapes can carry and no tokenizer can encode) and nesting past ``MAX_JSON_DEPTH``."""
    # (value, its depth, its path as (the parent's path, key): words for an error alone)
    stack: list[tuple[Any, int, Any]] = [(body, 0, None)]
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                keys = []
                while path is not None:
                    path, key = path
                    keys.append(_printable(key))
                where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}"
                                for k in reversed(keys)).lstrip(".")
                raise APIError(f"the string at {where or 'the top'} holds a lone surrogate "
                               f"(U+{ord(v[e.start]):04X}): send text as valid UTF-8, or "
                               "escape characters past U+FFFF as a pair of surrogates",
                               param=str(keys[-1]) if keys else None) from None
        elif isinstance(v, (dict, list)):
            if v and depth + 1 > MAX_JSON_DEPTH:
                raise APIError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
            is_dict = isinstance(v, dict)
            pairs = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in pairs:
                if is_dict:  # a key is a string too
                    stack.append((k, depth + 1, (path, k)))
                if isinstance(x, (str, dict, list)):  # (numbers, booleans, nulls: nothing)
                    stack.append((x, depth + 1, (path, k)))


def _printable(key: Any) -> Any:
    """A key of the body as an error may print it (a lone surrogate escaped)."""
    return key.encode("utf-8", "backslashreplace").decode() if isinstance(key, str) else key


async def _body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except RecursionError:
        raise APIError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        raise APIError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    _check_tree(body)
    return body


class Server:
    """The state behind the routes: model, engine runner, counters.

    ``max_tokens``: the most tokens one request may ask for (None: the context);
    ``parse_special``: read special-token text inside messages as special tokens (off: a
    user's ``<|im_start|>`` is plain text, only the chat template's markers are special);
    ``row_invariant``: the engine's (``BatchEngine``), every step batched."""

    def __init__(self, model: Any, parallel: int = 4, queue_limit: int = 64,
                 model_name: str | None = None, prefill_chunk: int = 64,
                 max_tokens: int | None = None, parse_special: bool = False,
                 row_invariant: bool = False) -> None:
        self.model = model
        self.tok = model.tokenizer
        self.engine = BatchEngine(model, max_batch=parallel, prefill_chunk=prefill_chunk,
                                  row_invariant=row_invariant)
        self.runner = Runner(self.engine, queue_limit)
        self.name = model_name or "clops"
        self.created = int(time.time())
        self.max_tokens = max_tokens
        self.parse_special = parse_special
        self.latencies = Latencies()
        self._vocab: Vocabulary | None = None
        stops = set(self.tok.eos_ids)
        for marker in _END_OF_TURN:
            tid = self.tok.backend.token_to_id(marker)
            if tid is not None:
                stops.add(tid)
        self.stop_ids = stops

    def card(self) -> dict:
        """The served model, as ``/v1/models`` lists it."""
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "clops"}

    def vocab(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = Vocabulary(self.tok, self.model.config.vocab_size)
        return self._vocab

    @functools.cached_property
    def added_tokens(self) -> dict[str, int]:
        """The tokenizer's added tokens, text -> id (a tool-call syntax's markers among them)."""
        return {t.content: i for i, t in self.tok.backend.get_added_tokens_decoder().items()
                if t.content}

    def count(self, endpoint: str) -> None:
        r = self.runner.stats.requests
        r[endpoint] = r.get(endpoint, 0) + 1

    # -- prompts -----------------------------------------------------------------------------------
    def chat_ids(self, body: dict, tools: list[dict] | None = None) -> list[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise APIError("'messages' must be a non-empty list", param="messages")
        clean = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise APIError(f"messages[{i}] must be an object with a 'role'",
                               param="messages")
            if m["role"] not in ROLES:
                # (a role is written into the template's markup: an arbitrary one could
                # spell the markers of another turn)
                raise APIError(f"messages[{i}].role {m['role']!r} is not one of "
                               f"{', '.join(ROLES)}", param="messages")
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                for j, part in enumerate(content):
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind != "text" or not isinstance(part.get("text"), str):
                        raise APIError(f"messages[{i}].content[{j}] is {kind or 'not'} a text "
                                       "part: this server's models read text only",
                                       param="messages")
                content = "".join(part["text"] for part in content)
            if content is not None and not isinstance(content, str):
                raise APIError(f"messages[{i}].content must be a string or text parts",
                               param="messages")
            clean.append({**m, "content": content or ""})
        try:
            return self.tok.encode_chat(clean, add_generation_prompt=True, tools=tools,
                                        parse_special=self.parse_special)
        except ValueError as e:
            raise APIError(str(e)) from None

    def prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tok.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if isinstance(prompt, list) and len(prompt) == 1:
            return self.prompt_ids(prompt[0])
        raise APIError("'prompt' must be a string or a list of token ids", param="prompt")

    def budget(self, body: dict, ids: list[int], chat: bool) -> int:
        """The request's completion tokens: ``max_tokens`` (or ``max_completion_tokens``), by
        default 16 for completions (as OpenAI's) and the rest of the context for chat, within
        the server's ``max_tokens``."""
        ctx, cap = self.engine.context, self.max_tokens
        if not ids:
            raise APIError("the prompt is empty", param="messages")
        if len(ids) >= ctx:
            raise APIError(f"the prompt has {len(ids)} tokens; the context is {ctx} tokens "
                           "(prompt and completion together)", code="context_length_exceeded")
        name = "max_tokens"
        if body.get("max_completion_tokens") is not None:
            name = "max_completion_tokens"
            if body.get("max_tokens") not in (None, body["max_completion_tokens"]):
                raise APIError("'max_tokens' and 'max_completion_tokens' differ: give one of "
                               "them", param="max_tokens")
        default = ctx - len(ids) if chat else min(COMPLETIONS_DEFAULT_TOKENS, ctx - len(ids))
        if cap is not None:
            default = min(default, cap)
        n = _get(body, name, int, default, lambda v: v >= 1, "1 or more")
        if cap is not None and n > cap:
            raise APIError(f"{name} {n} is more than this server gives one request ({cap} "
                           "tokens)", param=name)
        if len(ids) + n > ctx:
            raise APIError(f"{name} {n} + {len(ids)} prompt tokens exceed the context of "
                           f"{ctx} tokens", param=name, code="context_length_exceeded")
        return n

    # -- one choice --------------------------------------------------------------------------------
    async def choice(self, ids: list[int], params: SamplingParams, max_new: int,
                     stops: list[str], grammar: str | None, ignore_eos: bool = False,
                     arrived: float | None = None,
                     ) -> AsyncIterator[tuple[str, list[StepOutput], str | None]]:
        """(new text, the tokens it came from, finish reason or None), as tokens arrive;
        ``ignore_eos`` runs past end-of-text tokens (as llama-server's option does);
        ``arrived``: the request's ``time.monotonic()``, for the latency histograms."""
        arrived = time.monotonic() if arrived is None else arrived
        first: float | None = None
        made = 0

        def ended() -> None:  # the choice ran to its end: its latencies
            now = time.monotonic()
            self.latencies.request.observe(now - arrived)
            if first is not None and made > 1:
                self.latencies.per_token.observe((now - first) / (made - 1))

        stop_ids = set() if ignore_eos else self.stop_ids
        constraint = Constraint(self.vocab(), grammar) if grammar else None
        h = await self.runner.submit(ids, params, max_new,
                                     constraint.mask if constraint else None,
                                     constraint.consume if constraint else None)
        stream = TextStream(self.tok)
        pending: list[StepOutput] = []
        sent = 0
        hold = max((len(s) for s in stops), default=1) - 1
        text = ""
        try:
            while True:
                o = await h.queue.get()
                if isinstance(o, Exception):
                    raise o
                made += 1
                if first is None:
                    first = time.monotonic()
                    self.latencies.first_token.observe(first - arrived)
                if o.token in stop_ids:
                    self.runner.cancel(h)
                    ended()
                    yield self.tok.decode(stream.ids)[sent:], pending, "stop"
                    return
                pending.append(o)
                stream.push(o.token)
                finished = o.finished or (constraint is not None
                                          and constraint.finished(len(stream.ids)))
                # the whole text once at the end: ids held back (an incomplete UTF-8
                # sequence) come out as one decode of them all gives them
                text = self.tok.decode(stream.ids) if finished else stream.text
                cut = _find_stop(text, stops)
                if cut is not None:
                    self.runner.cancel(h)
                    ended()
                    yield text[sent:cut], pending, "stop"
                    return
                if finished:
                    if o.finished:
                        h.done = True  # the engine has let it go already
                    else:  # the grammar is complete: free the sequence now
                        self.runner.cancel(h)
                    ended()
                    yield text[sent:], pending, "length" if o.finished else "stop"
                    return
                if stream.held or not h.queue.empty():
                    # an incomplete UTF-8 sequence; or more tokens are here already (the
                    # event loop behind the engine): one chunk for them all
                    continue
                safe = len(text) - hold
                if safe > sent or pending:
                    piece = text[sent:max(safe, sent)]
                    sent = max(safe, sent)
                    yield piece, pending, None
                    pending = []
        finally:
            self.runner.cancel(h)

    def logprob_entry(self, o: StepOutput) -> dict:
        def one(t: int, lp: float) -> dict:
            s = self.tok.decode([t])
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        e = one(o.token, o.logprob)
        e["top_logprobs"] = [one(t, lp) for t, lp in o.top]
        return e


async def _merged(gens: list[AsyncIterator[tuple[str, list[StepOutput], str | None]]],
                  ) -> AsyncIterator[tuple[int, str, list[StepOutput], str | None]]:
    """The items of several choices' generators as they come, each with its choice's index;
    leaving early (a client gone) cancels them all, which frees their sequences."""
    if len(gens) == 1:  # one choice (the usual request): no task and queue in between
        gen = gens[0]
        try:
            async for item in gen:
                yield (0, *item)
        finally:
            await gen.aclose()  # type: ignore[attr-defined]
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, gen: AsyncIterator) -> None:
        try:
            async for item in gen:
                await q.put((i, item))
        except Exception as e:  # noqa: BLE001 - re-raised by the reader
            await q.put((i, e))
        finally:
            await q.put((i, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    left = len(tasks)
    try:
        while left:
            i, item = await q.get()
            if item is done:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield (i, *item)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _find_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# -- completions, chat and plain ------------------------------------------------------------------
@dataclass
class _Job:
    """One completion request, read and checked."""

    chat: bool
    ids: list[int]
    max_new: int
    params: SamplingParams
    n: int
    stops: list[str]
    grammar: str | None
    tools: list[dict] | None  # where given, the answer is read for tool calls
    want_lp: bool
    stream: bool
    ignore_eos: bool
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    echo: str | None = None  # completions' echo: the prompt's text, before the completion's
    parallel: bool = True  # parallel_tool_calls: more than one call may be read back
    rid: str = ""
    arrived: float = 0.0  # the request's time.monotonic(), for the latency histograms
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def kind(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def choices(self, server: Server) -> list[AsyncIterator[tuple[str, list[StepOutput],
                                                                  str | None]]]:
        """A generator per choice (each with its own seed, where one was given)."""
        base = self.params.__dict__
        return [server.choice(self.ids, SamplingParams(**{
                    **base, "seed": base["seed"] + i if base["seed"] is not None else None}),
                    self.max_new, self.stops, self.grammar, self.ignore_eos, self.arrived)
                for i in range(self.n)]

    def usage(self, completion: int) -> dict:
        return {"prompt_tokens": len(self.ids), "completion_tokens": completion,
                "total_tokens": len(self.ids) + completion}


def _job(server: Server, body: dict, chat: bool, arrived: float) -> _Job:
    _refuse_what_cannot_take_effect(body, chat)
    tools, choice, parallel = _tools(server, body) if chat else (None, ToolChoice("none"), True)
    ids = server.chat_ids(body, tools) if chat else server.prompt_ids(body.get("prompt"))
    max_new = server.budget(body, ids, chat)
    params, n = _sampling(body)
    if chat:
        want_lp = _get(body, "logprobs", bool, False)
        top = _get(body, "top_logprobs", int, 0, lambda v: 0 <= v <= 20, "0 to 20")
        if top and not want_lp:
            raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        params.logprobs = top if want_lp else 0
    else:
        lp = _get(body, "logprobs", int, None, lambda v: 0 <= v <= 5, "0 to 5")
        want_lp = lp is not None
        params.logprobs = lp or 0
        best_of = _get(body, "best_of", int, n, lambda v: v >= 1, "1 or more")
        if best_of != n:
            raise APIError(f"'best_of' {best_of} would rank more choices than the {n} returned, "
                           "which this server does not do: leave it out or make it 'n'",
                           param="best_of")
    grammar = grammar_for(body.get("response_format"))
    if choice.forced:
        grammar = _forced_tool_grammar(server, body, tools or [], choice, parallel, grammar)
    if grammar is not None:
        server.vocab().check(grammar, "tools" if choice.forced else "response_format")
    stream = _get(body, "stream", bool, False)
    opts = _get(body, "stream_options", dict, {})
    if opts and not stream:
        raise APIError("'stream_options' is for streamed requests ('stream': true)",
                       param="stream_options")
    echo = None
    if not chat and _get(body, "echo", bool, False):
        prompt = body.get("prompt")
        echo = prompt if isinstance(prompt, str) else \
            prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], str) else \
            server.tok.decode(ids)
    if echo is not None and want_lp:
        raise APIError("'echo' with 'logprobs' would need the prompt's log-probabilities, "
                       "which this server does not compute", param="echo")
    return _Job(chat, ids, max_new, params, n, _stops(body), grammar, tools, want_lp, stream,
                _get(body, "ignore_eos", bool, False),
                _get(opts, "include_usage", bool, False), echo, parallel,
                ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], arrived)


def _tools(server: Server, body: dict) -> tuple[list[dict] | None, ToolChoice, bool]:
    """The tools offered to the model (None: none), the request's tool_choice, and whether
    more than one call may come back (``parallel_tool_calls``)."""
    parallel = _get(body, "parallel_tool_calls", bool, True)
    offered = body.get("tool_choice") != "none"  # "none": the model is not told of them
    try:
        tools = check_tools(body.get("tools"), server.tok.chat_template, offered)
    except ValueError as e:
        raise APIError(str(e), param="tools") from None
    try:
        choice = read_tool_choice(body.get("tool_choice"), tools)
    except ValueError as e:
        raise APIError(str(e), param="tool_choice") from None
    return (tools if offered else None), choice, parallel


def _forced_tool_grammar(server: Server, body: dict, tools: list[dict], choice: ToolChoice,
                         parallel: bool, response_grammar: str | None) -> str:
    """The grammar that holds the answer to tool calls (``tool_choice`` "required" or a named
    function), in the tool-call syntax of the model's chat template."""
    what = repr(choice.name) if choice.name else '"required"'
    syntax = call_syntax(server.tok.chat_template)
    if syntax is None:
        raise APIError(f"tool_choice {what} cannot be enforced: this model's chat template asks "
                       "for no tool-call syntax this server knows (" +
                       ", ".join(" or ".join(repr(m) for m in s.markers) for s in SYNTAXES) +
                       "); use \"auto\"", param="tool_choice")
    if response_grammar is not None:
        raise APIError(f"'response_format' shapes a text answer, and tool_choice {what} allows "
                       "tool calls alone: leave one of them out", param="response_format")
    if _stops(body):
        raise APIError(f"'stop' cannot end an answer that tool_choice {what} holds to tool "
                       "calls (the calls' syntax decides where it ends)", param="stop")
    return tool_call_grammar(syntax, tools, choice.name, parallel, server.added_tokens)


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


def _text_only(v: Any) -> bool:
    return v == ["text"]


def _strings_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


# OpenAI's request fields that this server cannot honour beyond some values (absent or null
# always passes): (field, the routes that have it, the values it takes, why others cannot take
# effect). A value outside them is refused, naming the field.
_HONOURED_ONLY: list[tuple[str, str, Callable[[Any], bool], str]] = [
    ("modalities", "chat", _text_only, "this server's models write text only (['text'])"),
    ("audio", "chat", _one_of(), "this server's models write text only, not audio"),
    ("prediction", "chat", _one_of(), "predicted outputs are not supported"),
    ("reasoning_effort", "chat", _one_of(), "this server has no reasoning effort to set"),
    ("verbosity", "chat", _one_of(), "this server has no verbosity to set"),
    ("web_search_options", "chat", _one_of(), "this server does not search the web"),
    ("functions", "chat", _one_of(), "the deprecated 'functions' are not read: send 'tools'"),
    ("function_call", "chat", _one_of(), "the deprecated 'function_call' is not read: send "
     "'tool_choice' with 'tools'"),
    ("service_tier", "chat completions", _one_of("auto", "default"),
     "this server has one service tier, \"default\""),
    ("store", "chat completions", _one_of(False), "this server does not store completions"),
    ("metadata", "chat completions", _strings_map, "metadata is an object of strings"),
    ("user", "chat completions", lambda v: isinstance(v, str), "'user' is a string"),
    ("suffix", "completions", _one_of(""), "insertion (text after the completion) is not "
     "supported"),
    ("tools", "completions", _one_of(), "tools are for /v1/chat/completions"),
    ("tool_choice", "completions", _one_of(), "tool_choice is for /v1/chat/completions"),
]


def _refuse_what_cannot_take_effect(body: dict, chat: bool) -> None:
    route = "chat" if chat else "completions"
    for name, routes, honoured, why in _HONOURED_ONLY:
        v = body.get(name)
        if v is not None and route in routes.split() and not honoured(v):
            raise APIError(f"'{name}' {json.dumps(v)[:80]} is refused: {why}",
                           param=name)


async def chat_completions(request: Request) -> Response:
    return await _completions(request, chat=True)


async def completions(request: Request) -> Response:
    return await _completions(request, chat=False)


async def _completions(request: Request, chat: bool) -> Response:
    server: Server = request.app.state.server
    arrived = time.monotonic()
    body = await _body(request)
    server.count("chat" if chat else "completions")
    job = _job(server, body, chat, arrived)
    if not server.runner.alive:
        raise EngineDown(server.runner.health()[1])
    if job.stream:
        if job.grammar:  # what can fail, before the response starts
            server.vocab()
        return EventStream(_events(server, job))
    # the client may leave while its answer is made: watch for it, and cancel the work
    work = asyncio.ensure_future(_whole(server, job))
    await _first_of(work, asyncio.ensure_future(_until_disconnect(request)))
    if work.cancelled() or not work.done():
        server.runner.stats.disconnects += 1
        with contextlib.suppress(asyncio.CancelledError):
            await work  # its generators' cleanup (the sequences' cancels) runs now
        return Response(status_code=499)  # nobody reads it
    return work.result()


async def _until_disconnect(request: Request) -> None:
    await _disconnect(request.receive)


async def _disconnect(receive: Callable[[], Awaitable[Any]]) -> None:
    """Returns when the client has gone (its connection closed)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_of(work: asyncio.Future[Any], gone: asyncio.Future[Any]) -> None:
    """Wait until ``work`` is done or the client has gone (``gone``, ``_disconnect``'s), then
    cancel ``gone`` and, where it is not done, ``work``."""
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()


_DONE = "data: [DONE]\n\n"


class EventStream(Response):
    """A streamed request's server-sent events (``text/event-stream``), each string the
    events' iterator yields one write; the last one (ending in ``[DONE]``) with the end of
    the response. A client that leaves stops the iterator at its next event (closing it
    cancels its sequences), as Starlette's ``StreamingResponse`` does.

    PERF: the body goes to the server's own ``send`` (``limits.RAW_SEND``), past the three
    wrappers of the app's middleware, which look at a response's start alone; and the stream
    runs in one task, not an anyio task group. Starlette's StreamingResponse cost up to about
    10 us a token of 40-50 on two EPYC cores with 64 streams."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        stream = asyncio.ensure_future(self._stream(scope.get(RAW_SEND, send)))
        try:
            await _first_of(stream, asyncio.ensure_future(_disconnect(receive)))
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await stream  # (the iterator's cleanup runs now)

    async def _stream(self, send: Any) -> None:
        ended = False
        async for event in self.events:
            ended = event.endswith(_DONE)
            await send({"type": "http.response.body", "body": event.encode(),
                        "more_body": not ended})
        if not ended:  # (an error's event, or nothing)
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _chunk(server: Server, job: _Job, choices: list[dict], **extra: Any) -> str:
    return _sse({"id": job.rid, "object": job.kind + ".chunk" if job.chat else job.kind,
                 "created": job.created, "model": server.name, "choices": choices, **extra})


# A string no text holds, to cut a chunk's JSON around its text (JSON writes it "\u0000...")
_MARK = "\x00clops-text\x00"


class _TextChunks:
    """The event of a streamed request's text piece with nothing else in it (no finish
    reason, no log-probabilities): the bytes ``_chunk`` writes, cut once per choice around the
    text, so that a token's event is one ``json.dumps`` of its text and two joins.

    PERF: a dict and a ``json.dumps`` of it for every token took 3.9 us, the template 0.5, of
    a streamed token's 50-80 on a 2-core EPYC."""

    def __init__(self, server: Server, job: _Job) -> None:
        self.parts: list[tuple[str, str]] = []
        for i in range(job.n):
            ch: dict = {"index": i, "delta": {"content": _MARK}} if job.chat else \
                {"index": i, "text": _MARK}
            ch["finish_reason"] = None
            # (the text is the chunk's last field: a model name cannot move the cut)
            before, after = _chunk(server, job, [ch]).rsplit(json.dumps(_MARK), 1)
            self.parts.append((before, after))

    def __call__(self, i: int, piece: str) -> str:
        before, after = self.parts[i]
        return before + json.dumps(piece) + after


async def _events(server: Server, job: _Job) -> AsyncIterator[str]:
    """The server-sent events of a streamed request. An error once the stream has begun is
    an event of OpenAI's error body (the status line has gone out already); a client that
    leaves closes this generator, which cancels its sequences."""
    finished = False
    try:
        async for event in _stream_events(server, job):
            yield event
        finished = True
    except Exception as e:  # noqa: BLE001 - told to the client, in the stream
        server.runner.stats.errors += 1
        yield _sse(_as_api_error(e).body())
        finished = True
    finally:
        if not finished:
            server.runner.stats.disconnects += 1


async def _stream_events(server: Server, job: _Job) -> AsyncIterator[str]:
    """The events of a streamed request; events ready together (the first ones, a choice's
    last ones with the usage and ``[DONE]``) as one string, which the server writes at once."""
    completion, left = 0, job.n
    first: list[str] = []
    if job.chat:
        first += [_chunk(server, job, [{"index": i, "delta": {"role": "assistant",
                                                                "content": ""},
                                        "finish_reason": None}]) for i in range(job.n)]
    if job.echo:
        first += [_chunk(server, job, [{"index": i, "text": job.echo, "finish_reason": None}])
                  for i in range(job.n)]
    if first:
        yield "".join(first)
    held = [""] * job.n
    held_toks: list[list[StepOutput]] = [[] for _ in range(job.n)]
    text_chunk = _TextChunks(server, job)
    tail: list[str] = []  # the last choice's last events: they go with the usage and [DONE]
    async for i, piece, toks, reason in _merged(job.choices(server)):
        completion += len(toks)
        out = []
        if job.tools:  # the whole answer decides between content and calls
            held[i] += piece
            held_toks[i] += toks
            if reason is None:
                continue
            out = [_chunk(server, job, [last])
                   for last in _tool_deltas(server, job, i, held[i], held_toks[i], reason)]
        elif reason is None and not (job.want_lp and toks):
            if piece:
                out = [text_chunk(i, piece)]
        else:
            out = [_chunk(server, job, [_last_delta(server, job, i, piece, toks, reason)])]
        if reason is not None:
            left -= 1
        if left == 0:
            tail += out
        elif out:
            yield "".join(out)
    if job.include_usage:
        tail.append(_chunk(server, job, [], usage=job.usage(completion)))
    tail.append(_DONE)
    yield "".join(tail)


def _last_delta(server: Server, job: _Job, i: int, piece: str, toks: list[StepOutput],
                reason: str | None) -> dict:
    """The choice of a chunk with a finish reason or log-probabilities (any other text piece
    is ``_TextChunks``')."""
    if job.chat:
        ch: dict = {"index": i, "delta": {"content": piece} if piece else {},
                    "finish_reason": reason}
        if job.want_lp and toks:
            ch["logprobs"] = {"content": [server.logprob_entry(o) for o in toks]}
    else:
        ch = {"index": i, "text": piece, "finish_reason": reason}
        if job.want_lp and toks:
            ch["logprobs"] = _completion_logprobs(server, toks)
    return ch


def _tool_deltas(server: Server, job: _Job, i: int, text: str, toks: list[StepOutput],
                 reason: str) -> list[dict]:
    """The last chunks of choice ``i`` of a streamed request with tools, its whole ``text``
    read: each call's id, type and name with empty arguments, then its arguments, then
    ``finish_reason`` "tool_calls" (as OpenAI streams them); or the text as content."""
    content, calls = parse_tool_calls(text, job.tools or [], job.parallel)
    out: list[dict] = []
    for j, c in enumerate(calls):
        fn = c["function"]
        out.append({"index": i, "delta": {"tool_calls": [{
            "index": j, "id": c["id"], "type": "function",
            "function": {"name": fn["name"], "arguments": ""}}]}, "finish_reason": None})
        out.append({"index": i, "delta": {"tool_calls": [{
            "index": j, "function": {"arguments": fn["arguments"]}}]}, "finish_reason": None})
    if content and calls:
        out.insert(0, {"index": i, "delta": {"content": content}, "finish_reason": None})
    out.append({"index": i, "delta": {} if calls else {"content": content},
                "finish_reason": "tool_calls" if calls else reason})
    if job.want_lp and toks:
        out[0]["logprobs"] = {"content": [server.logprob_entry(o) for o in toks]}
    return out


async def _whole(server: Server, job: _Job) -> Response:
    """The response of a request that is not streamed."""
    texts = [job.echo or ""] * job.n
    reasons: list[str | None] = [None] * job.n
    toks: list[list[StepOutput]] = [[] for _ in range(job.n)]
    async for i, piece, t, r in _merged(job.choices(server)):
        texts[i] += piece
        toks[i] += t
        reasons[i] = r or reasons[i]
    choices = []
    for i in range(job.n):
        text, reason = texts[i], reasons[i]
        if not job.chat:
            choices.append({"index": i, "text": text, "finish_reason": reason,
                            "logprobs": _completion_logprobs(server, toks[i])
                            if job.want_lp else None})
            continue
        message: dict = {"role": "assistant", "content": text}
        if job.tools:
            content, calls = parse_tool_calls(text, job.tools, job.parallel)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls"
        choices.append({"index": i, "message": message, "finish_reason": reason,
                        "logprobs": {"content": [server.logprob_entry(o) for o in toks[i]]}
                        if job.want_lp else None})
    return JSONResponse({"id": job.rid, "object": job.kind, "created": job.created,
                         "model": server.name, "choices": choices,
                         "usage": job.usage(sum(len(t) for t in toks))})


# -- the other routes ---------------------------------------------------------------------------
async def embeddings(request: Request) -> Response:
    server: Server = request.app.state.server
    body = await _body(request)
    server.count("embeddings")
    inp = body.get("input")
    if isinstance(inp, str) or (isinstance(inp, list) and inp
                                and all(isinstance(t, int) for t in inp)):
        inp = [inp]
    if not isinstance(inp, list) or not inp or len(inp) > 64:
        raise APIError("'input' must be a string, a list of up to 64 strings, or token ids",
                       param="input")
    fmt = _get(body, "encoding_format", str, "float", _one_of("float", "base64"),
               '"float" or "base64"')
    width = server.model.config.dim
    dims = _get(body, "dimensions", int, width, lambda v: v >= 1, "1 or more")
    if dims != width:
        raise APIError(f"'dimensions' {dims}: this model's embeddings have {width} dimensions, "
                       "and this server does not shorten them", param="dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError("'user' must be a string", param="user")
    data, used = [], 0
    for i, item in enumerate(inp):
        ids = server.prompt_ids(item)
        if len(ids) > server.engine.context:
            raise APIError(f"input {i} has {len(ids)} tokens; the context is "
                           f"{server.engine.context}", param="input")
        vec = await server.runner.embed(ids)
        used += len(ids)
        # base64: the little-endian float32 bytes (what OpenAI's clients decode)
        emb: Any = base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode() \
            if fmt == "base64" else [float(v) for v in vec]
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return JSONResponse({"object": "list", "data": data, "model": server.name,
                         "usage": {"prompt_tokens": used, "total_tokens": used}})


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [request.app.state.server.card()]})


async def model(request: Request) -> Response:
    server: Server = request.app.state.server
    name = request.path_params["name"]
    if name != server.name:
        raise APIError(f"the model {name!r} does not exist here: this server serves "
                       f"{server.name!r}", status=404, param="model", code="model_not_found")
    return JSONResponse(server.card())


async def tokenize(request: Request) -> Response:
    """``{"content": text, "add_special": false, "parse_special": false}`` -> ``{"tokens":
    [ids], "count": n}`` (llama-server's shape; ``add_special`` prepends BOS where the model
    wants one)."""
    server: Server = request.app.state.server
    body = await _body(request)
    text = _get(body, "content", str, None)
    if text is None:
        raise APIError("'content' must be the text to tokenize", param="content")
    ids = server.tok.encode(text, add_special_tokens=_get(body, "add_special", bool, False),
                            parse_special=_get(body, "parse_special", bool, False))
    return JSONResponse({"tokens": ids, "count": len(ids),
                         "max_model_len": server.engine.context})


async def detokenize(request: Request) -> Response:
    """``{"tokens": [ids]}`` -> ``{"content": text}``."""
    server: Server = request.app.state.server
    body = await _body(request)
    ids = body.get("tokens")
    vocab = server.model.config.vocab_size
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise APIError(f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
    return JSONResponse({"content": server.tok.decode(ids)})


async def health(request: Request) -> Response:
    """200 while the engine serves; 503 with the reason when it cannot (its thread stopped,
    a step stalled, or the last few steps all failed)."""
    server: Server = request.app.state.server
    ok, why = server.runner.health()
    if ok:
        try:
            st = await server.runner.engine_stats(timeout=15.0)
        except EngineDown as e:
            ok, why = False, str(e)
    if not ok:
        return JSONResponse({"status": "error", "error": why}, status_code=503)
    return JSONResponse({"status": "ok", "slots_idle": server.engine.max_batch - st["running"],
                         "slots_processing": st["running"], "requests_waiting": st["waiting"]})


async def metrics(request: Request) -> Response:
    server: Server = request.app.state.server
    st = await server.runner.engine_stats()
    s = server.runner.stats
    rows: list[tuple[Any, ...]] = [
            ("clops_requests_total", "counter", "Requests received, by endpoint.", s.requests,
             "endpoint"),
            ("clops_requests_refused_total", "counter", "Requests refused before they were "
             "read, by reason.", request.app.state.limits.refused, "reason"),
            ("clops_request_errors_total", "counter", "Requests refused or failed.", s.errors),
            ("clops_client_disconnects_total", "counter", "Requests whose client left before "
             "the answer was whole (their work cancelled).", s.disconnects),
            ("clops_failed_steps_total", "counter", "Engine steps that failed.",
             s.failed_steps),
            ("clops_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
             st["prompt_tokens"]),
            ("clops_generated_tokens_total", "counter", "Tokens generated.",
             st["generated_tokens"]),
            ("clops_requests_running", "gauge", "Sequences decoding now.", st["running"]),
            ("clops_requests_waiting", "gauge", "Sequences waiting for a slot (queue depth).",
             st["waiting"]),
            ("clops_kv_blocks_free", "gauge", "Free KV cache blocks.", st["free_blocks"]),
            ("clops_kv_blocks_total", "gauge", "KV cache blocks.", st["total_blocks"]),
            ("clops_tokens_per_second", "gauge", "Generated tokens per second over the last "
             "10 s.", round(s.rate(), 3))]
    lines = [line for row in rows for line in metric(*row)]
    lines += server.latencies.text()
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


async def page(request: Request) -> Response:
    html = resources.files(__package__).joinpath("static/index.html").read_text()
    return HTMLResponse(html)


def _guarded(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request],
                                                                           Awaitable[Response]]:
    """The route, with every error it raises as OpenAI's error body (never a dropped
    connection, never the server stopped)."""

    async def handler(request: Request) -> Response:
        try:
            return await route(request)
        except Exception as e:  # noqa: BLE001 - reported to the client; the server goes on
            request.app.state.server.runner.stats.errors += 1
            return _as_api_error(e).response()

    handler.__name__ = route.__name__
    return handler


def _as_api_error(e: Exception) -> APIError:
    """The OpenAI error of an exception raised while serving a request."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ConstraintError):
        return APIError(str(e), param=e.param)
    if isinstance(e, QueueFull):
        return APIError(str(e), status=429, kind="rate_limit_error")
    if isinstance(e, EngineDown):
        return APIError(str(e), status=503, kind="server_error", code="engine_down")
    if isinstance(e, ValueError):  # the engine's own checks
        return APIError(str(e))
    return APIError(f"{type(e).__name__}: {e}", status=500, kind="server_error")


ROUTES = [("/v1/chat/completions", chat_completions, "POST"),
          ("/v1/completions", completions, "POST"),
          ("/v1/embeddings", embeddings, "POST"),
          ("/v1/models", models, "GET"),
          ("/v1/models/{name:path}", model, "GET"),
          ("/tokenize", tokenize, "POST"),
          ("/detokenize", detokenize, "POST"),
          ("/health", health, "GET"),
          ("/metrics", metrics, "GET")]


def create_app(server: Server, limits: Limits | None = None) -> Any:
    """The ASGI app of ``server``, behind ``limits`` (an API key, body size and read time)."""
    limits = limits or Limits()
    routes = [Route(path, _guarded(fn), methods=[method]) for path, fn, method in ROUTES]
    routes.append(Route("/", page, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.runner.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    guarded = LimitsMiddleware(app, limits)
    app.state.server, app.state.limits = server, guarded
    if not limits.cors_origins:
        return guarded
    # outermost: a browser's preflight is answered before the key and body are asked for
    return CORSMiddleware(guarded, allow_origins=list(limits.cors_origins),
                          allow_methods=["GET", "POST", "OPTIONS"],
                          allow_headers=["Authorization", "Content-Type"], max_age=600)


def _completion_logprobs(server: Server, toks: list[StepOutput]) -> dict:
    dec = server.tok.decode
    return {"tokens": [dec([o.token]) for o in toks],
            "token_logprobs": [o.logprob for o in toks],
            "top_logprobs": [{dec([t]): lp for t, lp in o.top} for o in toks],
            "text_offset": []}
