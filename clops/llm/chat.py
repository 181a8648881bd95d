"""llm, chat: renders a model's Jinja chat template in a sandbox, within limits of time and size.

A chat template comes inside a model file, so it is untrusted code. jinja2's
``ImmutableSandboxedEnvironment`` keeps it away from Python's internals; on top of that, every
way a template can spend time or memory passes a guard that counts against ``TemplateLimits``:
loop iterations and calls (and the wall clock, read at each of them), nested macro calls, the
size of a ``range``, the size of integers, the characters of every string or list the template
makes (repetition, concatenation, ``%`` and ``format``, padding, filters, method calls), and the
length of the rendered text. A template that passes a limit raises ``TemplateLimitError``, which
names the limit; any other failure of a template raises ``TemplateError`` too.
"""

from __future__ import annotations

import contextvars
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from functools import cache, lru_cache, update_wrapper
from typing import Any

from jinja2 import Template, TemplateSyntaxError, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension
from jinja2.runtime import BlockReference, Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer


class TemplateError(ValueError):
    """The chat template rejected the conversation (it called raise_exception), or failed."""


class TemplateLimitError(TemplateError):
    """The chat template went past one of its ``TemplateLimits``; ``limit`` names the field."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(f"chat template stopped: {message} (limit TemplateLimits.{limit}; a "
                         "template from a model file should never get near it: the template is "
                         "broken or hostile)")
        self.limit = limit


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render of a chat template. Real templates stay far below them.

    ``render(..., limits=TemplateLimits(seconds=0.5))`` tightens one."""

    seconds: float = 2.0  # wall clock, read at every step
    steps: int = 1_000_000  # loop iterations, calls and filters
    depth: int = 64  # macro calls (and recursive loops) inside each other
    range: int = 100_000  # items of one range()
    chars: int = 1 << 24  # characters of all the strings and lists a render makes, summed
    output: int = 1 << 22  # characters of the rendered prompt
    int_bits: int = 4096  # bits of an integer made by +, * or **
    template: int = 1 << 16  # characters of the template's source (compiling it is not timed)


LIMITS = TemplateLimits()


class _Budget:
    """What one render has spent so far (kept in a context variable while it runs)."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.steps = 0
        self.chars = 0
        self.depth = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise TemplateLimitError(
                "steps", f"more than {self.limits.steps} loop iterations, calls and filters")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError("seconds", f"rendering took more than "
                                     f"{self.limits.seconds:g} s")

    def charge(self, chars: int, what: str) -> None:
        """Count ``chars`` characters about to be made (or just made) by ``what``."""
        self.chars += chars
        if self.chars > self.limits.chars:
            raise TemplateLimitError(
                "chars", f"{what} would take the characters made by the template past "
                f"{self.limits.chars}")

    def left(self) -> int:
        """Characters the render may still make (sizes are measured up to one more)."""
        return max(self.limits.chars - self.chars, 0) + 1

    def check_int(self, bits: int, what: str) -> None:
        if bits > self.limits.int_bits:
            raise TemplateLimitError(
                "int_bits", f"{what} would make an integer of about {bits} bits, more than "
                f"{self.limits.int_bits}")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_budget",
                                                                          default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        raise TemplateError("chat templates render through clops.llm.chat.render only")
    return budget


# -- sizes -----------------------------------------------------------------------------------
_SMALL = 24  # characters of a number, None, or an object whose text is short


def _size(value: Any, cap: int) -> int:
    """About the characters ``str(value)`` takes, containers summed through; counting stops
    past ``cap`` (so a list holding itself, or many references to one big string, is cheap)."""
    total = 0
    stack = [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, (str, bytes, bytearray)):
            total += len(v)
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(v)
            kinds = set(map(type, v))
            # PERF: lists of strings or of integers are summed at C speed (a list doubled until
            # it passed the limit took 3.3 s to measure item by item, 0.4 s so)
            if kinds <= {str}:
                total += sum(map(len, v))
            elif kinds <= {int}:
                total += sum(map(int.bit_length, v)) // 3 + 2 * len(v)
            else:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, range):
            total += len(v) * (_size(max(abs(v.start), abs(v.stop)), cap) + 2)
        elif isinstance(v, Namespace):
            # NOTE: jinja2 keeps a namespace's attributes in a name-mangled dict
            total += 12
            stack.append(getattr(v, "_Namespace__attrs", None))
        else:
            total += _SMALL
    return total


def _measure(value: Any) -> int:
    """``_size`` up to what the running render may still make."""
    return _size(value, _budget().left())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


# -- estimates of what an operation will make, checked before it runs --------------------------
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _format_estimate(fmt: str, args: Iterable[Any]) -> int:
    """Characters that formatting ``fmt`` (printf-style or ``str.format``) can make with ``args``:
    each field at most its width and precision plus the largest argument (a field may repeat an
    argument)."""
    values = list(args)
    too_many = _budget().left()
    biggest = max((_measure(v) for v in values), default=0)
    widest = max((abs(v) for v in values if isinstance(v, int)), default=0)
    fields = 0
    numbers = 0
    if "%" in fmt:
        for m in _PRINTF.finditer(fmt):
            fields += 1
            for part in m.groups():
                if part == "*":
                    numbers += widest
                elif part:
                    numbers += int(part) if len(part) < 12 else too_many
    if "{" in fmt:
        try:
            parsed = list(string.Formatter().parse(fmt))
        except ValueError:
            parsed = []  # str.format raises the same error itself
        for _, field, spec, _ in parsed:
            if field is None:
                continue
            fields += 1
            if spec and "{" in spec:
                numbers += 2 * widest  # nested fields: a width and a precision from the args
            for digits in re.findall(r"\d+", spec or ""):
                numbers += int(digits) if len(digits) < 12 else too_many
    return len(fmt) + numbers + fields * (biggest + _SMALL)


def _mapping_values(mapping: Any) -> list[Any]:
    return list(mapping.values()) if isinstance(mapping, dict) else [mapping]


def _replace_estimate(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    text, old_s, new_s = str(s), str(old), str(new)
    found = text.count(old_s) if old_s else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new_s) - len(old_s), 0)


def _width(s: Any, width: Any = 0, *_: Any, **__: Any) -> int:
    return max(_measure(s), _int(width) or 0)


def _indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> int:
    text = str(s)
    pad = len(width) if isinstance(width, str) else (_int(width) or 0)
    return len(text) + (text.count("\n") + 1) * max(pad, 0)


def _wordwrap(s: Any, width: Any = 79, break_long: Any = True, wrapstring: Any = None,
              *_: Any, **kw: Any) -> int:
    wrap = kw.get("wrapstring", wrapstring)
    text = str(s)
    return len(text) * (1 + len(str(wrap) if wrap is not None else "\n"))


def _fill(value: Any, count: Any = 0, fill_with: Any = None, *_: Any, **kw: Any) -> int:
    n = max(_int(count) or 0, 0)
    return _measure(value) + n * (2 + _measure(kw.get("fill_with", fill_with)))


def _join(value: Any, d: Any = "", *_: Any, **kw: Any) -> int | None:
    if not isinstance(value, (list, tuple, dict, str)):
        return None  # a generator: its items were counted as they were made
    return _measure(value) + len(str(kw.get("d", d))) * len(value)


def _sum(value: Any, attribute: Any = None, start: Any = 0, *_: Any, **kw: Any) -> int:
    first = kw.get("start", start)
    if not isinstance(first, (int, float)):
        # NOTE: summing lists copies the running total at every item: quadratic time in one
        # call, which no deadline can interrupt
        raise TemplateError("the chat template's sum filter adds only numbers here")
    return 0


# Filters whose output can be much larger than their input: the estimate of what they make,
# from their arguments (the value first), charged before they run. The others are charged
# with what they return.
_FILTER_ESTIMATES: dict[str, Callable[..., int | None]] = {
    "center": _width,  # pads to any width
    "indent": _indent,  # a prefix of any width on every line
    "replace": lambda s, old="", new="", count=None, *a, **k: _replace_estimate(
        s, old, new, -1 if count is None else count),
    "wordwrap": _wordwrap,  # wrapstring on every line
    "format": lambda fmt, *args, **kw: _format_estimate(str(fmt), [*args, *kw.values()]),
    "batch": _fill,  # fill_with up to the batch size
    "slice": _fill,  # fill_with in every slice
    "join": _join,
    "sum": _sum,
}

# Methods of strings (and bytes) whose output can be much larger than their input.
_METHOD_ESTIMATES: dict[str, Callable[..., int | None]] = {
    "center": _width,
    "ljust": _width,
    "rjust": _width,
    "zfill": _width,
    "expandtabs": lambda s, tabsize=8, *a, **k: len(s) * max(_int(tabsize) or 1, 1),
    "replace": lambda s, old, new, count=-1, *a, **k: _replace_estimate(s, old, new, count),
    "translate": lambda s, table, *a, **k: len(s) * max(
        [1] + [_measure(v) for v in _mapping_values(table)]),
}


def _method_estimate(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[int | None, tuple[Any, ...]]:
    """What calling ``obj`` (a builtin method, or jinja2's safe ``str.format``) will make, if
    that can be much more than its arguments; and the arguments to call it with."""
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and getattr(wrapped, "__name__", "") in ("format", "format_map") \
            and isinstance(getattr(wrapped, "__self__", None), str):
        values = [*args, *kwargs.values()]
        if getattr(wrapped, "__name__", "") == "format_map" and args:
            values = _mapping_values(args[0])
        return _format_estimate(wrapped.__self__, values), args
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes, bytearray)):
        if name == "join" and args:
            items = list(args[0])  # materialized once, so that it is measured and then joined
            total = _measure(items) + len(owner) * len(items)
            return total, (items, *args[1:])
        estimate = _METHOD_ESTIMATES.get(name)
        if estimate is not None:
            return estimate(owner, *args, **kwargs), args
    if isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        return max(_int(length) or 0, 0), args
    return None, args


# -- binary operators --------------------------------------------------------------------------
_SEQUENCES = (str, bytes, list, tuple)


def _check_binop(budget: _Budget, op: str, left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "*":
        if ints:
            budget.check_int(left.bit_length() + right.bit_length(), "'*'")
        elif isinstance(left, _SEQUENCES) and isinstance(right, int):
            budget.charge(_measure(left) * max(right, 0), "'*' (repetition)")
        elif isinstance(right, _SEQUENCES) and isinstance(left, int):
            budget.charge(_measure(right) * max(left, 0), "'*' (repetition)")
    elif op == "**":
        if ints and right > 0 and abs(left) > 1:
            budget.check_int(left.bit_length() * right, "'**'")
    elif op == "+":
        if ints:
            budget.check_int(max(left.bit_length(), right.bit_length()) + 1, "'+'")
        elif isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            budget.charge(_measure(left) + _measure(right), "'+'")
    elif op == "%" and isinstance(left, (str, bytes)):
        args = right if isinstance(right, tuple) else _mapping_values(right)
        fmt = left if isinstance(left, str) else left.decode("latin-1")
        budget.charge(_format_estimate(fmt, args), "'%' (formatting)")


# -- the guards a template's code calls --------------------------------------------------------
_ITERATE = "_clops_iterate"
_CONCAT = "_clops_concat"


def _iterate(iterable: Any) -> Iterator[Any]:
    """A for-loop's items, one step each."""
    budget = _budget()
    for item in iterable:
        budget.step()
        yield item


def _concat(values: tuple[Any, ...]) -> str:
    """The ``~`` operator: the text of the values, joined."""
    budget = _budget()
    budget.charge(sum(_size(v, budget.left()) for v in values), "'~'")
    return "".join(str(v) for v in values)


def _range(*args: int) -> range:
    budget = _budget()
    r = range(*args)
    try:
        n = len(r)
    except OverflowError:
        n = budget.limits.range + 1
    if n > budget.limits.range:
        raise TemplateLimitError("range", f"range() of {n} items, more than "
                                 f"{budget.limits.range}")
    return r


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: its text will be made, so it counts."""
    budget = _budget()
    if not isinstance(value, str):
        budget.charge(_size(value, budget.left()), "the text of a value")
    return value


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    estimate = _FILTER_ESTIMATES.get(name)
    # jinja2 passes the context, eval context or environment first to some filters
    skip = 1 if hasattr(fn, "jinja_pass_arg") else 0

    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.step()
        made = estimate(*args[skip:], **kwargs) if estimate is not None else None
        if made is not None:
            budget.charge(made, f"the {name} filter")
        result = fn(*args, **kwargs)
        if made is None:
            budget.charge(_size(result, budget.left()), f"the {name} filter")
        return result

    return update_wrapper(guarded, fn)  # keeps jinja_pass_arg


class _Guards(NodeTransformer):
    """Rewrites a parsed template so that for-loops and ``~`` go through the guards."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _ITERATE, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(nodes.Tuple(node.nodes, "load", lineno=node.lineno), _CONCAT, [], [],
                            None, None, lineno=node.lineno)


class _GuardedCodeGenerator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        guarded = _Guards().visit(node)
        guarded.set_environment(self.environment)
        super().visit_Template(guarded, frame)


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, operator that can grow a value, and join counted."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.step()
        _check_binop(budget, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.step()
        template_code = isinstance(obj, (Macro, LoopContext, BlockReference))
        if isinstance(obj, LoopContext) and args:  # loop(children) in a recursive loop
            args = (_iterate(args[0]), *args[1:])
        made, args = _method_estimate(obj, args, kwargs)
        if made is not None:
            budget.charge(made, f"{getattr(obj, '__name__', 'a call')}()")
        if template_code:
            budget.depth += 1
            if budget.depth > budget.limits.depth:
                raise TemplateLimitError("depth", f"more than {budget.limits.depth} macro, "
                                         "block or loop calls inside each other")
        try:
            result = super().call(context, obj, *args, **kwargs)
        finally:
            if template_code:
                budget.depth -= 1
        if made is None and not template_code and not isinstance(result, range):
            budget.charge(_size(result, budget.left()),
                          f"{getattr(obj, '__name__', 'a call')}()")
        return result

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """The text of a macro, call block, set block or filter block, joined."""
        parts = list(pieces)
        _budget().charge(sum(len(p) for p in parts), "a block's text")
        return "".join(parts)


def _raise(message: str) -> None:
    raise TemplateError(message)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training
    masks in transformers; renders its body (SmolLM3's template uses it)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return list(parser.parse_statements(("name:endgeneration",), drop_needle=True))


# names of a message's reasoning text; templates read "reasoning_content" (gpt-oss "thinking")
_REASONING = ("reasoning_content", "thinking", "reasoning")


def _messages(messages: list[Any]) -> list[Any]:
    """The messages as transformers hands them to a template: keys whose value is None left
    out, and reasoning given under any of its names filled in as "reasoning_content" (and
    "thinking")."""
    out = []
    for m in messages:
        if isinstance(m, dict):
            m = {k: v for k, v in m.items() if v is not None}
            reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
            if reasoning is not None:
                m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON as chat templates expect it (and transformers renders it): keys in their order,
    non-ASCII kept, a plain string (jinja2's own ``tojson`` sorts keys and returns markup that
    escapes the strings concatenated with it)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@cache
def _environment() -> _GuardedEnvironment:
    # loop controls ({% break %}, {% continue %}): chat templates use them, as transformers
    # renders them
    env = _GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                              extensions=["jinja2.ext.loopcontrols", _Generation])
    env.filters = {name: _guard_filter(name, fn) for name, fn in env.filters.items()}
    env.filters["tojson"] = _guard_filter("tojson", _tojson)
    env.filters[_ITERATE] = _iterate
    env.filters[_CONCAT] = _concat
    env.globals.pop("lipsum", None)  # makes text of any length; no chat template uses it
    env.globals["range"] = _range
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
    return env


@lru_cache(maxsize=16)
def _compiled(template: str) -> Template:
    # PERF: compiling took 70 ms of each render of Llama 3.1's template (2-core EPYC); a
    # compiled template renders any number of times, in any thread
    return _environment().from_string(template)


def render(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "",
           limits: TemplateLimits | None = None, tools: list[dict[str, Any]] | None = None,
           ) -> str:
    """The prompt text for ``messages`` ([{"role": ..., "content": ...}, ...]); ``tools``
    (OpenAI-style function descriptions) are given to templates that take them.

    Raises ``TemplateError`` when the template fails or rejects the conversation, and
    ``TemplateLimitError`` (a ``TemplateError``) when it goes past one of ``limits``
    (default ``LIMITS``).

    >>> render("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
    ...        [{"role": "user", "content": "hi"}])
    '<user>hi'
    """
    limits = limits or LIMITS
    if len(template) > limits.template:
        raise TemplateLimitError("template", f"the template has {len(template)} characters, "
                                 f"more than {limits.template}")
    budget = _Budget(limits)
    token = _BUDGET.set(budget)
    try:
        tmpl = _compiled(template)
        pieces: list[str] = []
        made = 0
        extra = {"tools": tools} if tools is not None else {}
        stream = tmpl.generate(messages=_messages(messages),
                               add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
        try:
            for piece in stream:
                made += len(piece)
                if made > limits.output:
                    raise TemplateLimitError("output", f"the rendered prompt is longer than "
                                             f"{limits.output} characters")
                pieces.append(piece)
        finally:
            getattr(stream, "close", lambda: None)()  # a generator: stop it now, not at exit
        return "".join(pieces)
    except TemplateError:
        raise
    except TemplateSyntaxError as e:
        raise TemplateError(f"the chat template does not parse: line {e.lineno}: "
                            f"{_short(e.message or '')}") from None
    except RecursionError:
        raise TemplateError("the chat template failed: it nests too deeply") from None
    except Exception as e:
        raise TemplateError(f"the chat template failed: {type(e).__name__}: "
                            f"{_short(str(e))}") from e
    finally:
        _BUDGET.reset(token)


def _short(text: str, most: int = 300) -> str:
    return text if len(text) <= most else text[:most] + "..."


# -- where pieces of the caller's strings went -------------------------------------------------
# One private-use character of plane 16 stands for each piece in a second render: no text a
# model reads, and one character that trimming, splitting or JSON leaves as it is; Python's
# repr (a template that writes a list as text) spells it \U0010xxxx.
_SENTINEL_FIRST, _SENTINEL_LAST = 0x100000, 0x10FFFD
_SENTINEL = re.compile(r"([\U00100000-\U0010fffd]|\\U0010[0-9a-f]{4})")


def locate(template: str, messages: list[dict[str, Any]], text: str,
           pieces: Callable[[str], list[tuple[int, int]]], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", tools: list[dict[str, Any]] | None = None,
           limits: TemplateLimits | None = None) -> list[tuple[int, int]] | None:
    """Where in ``text``, the render of ``messages`` (and ``tools``), the pieces of the
    conversation's strings went: ``pieces(s)`` gives the sorted, disjoint (start, end) spans of
    string ``s`` to find. Returns the spans in ``text`` (sorted, disjoint), or None when that
    cannot be known: the template changed or tested such a piece, or wrote it other than as it
    is, as JSON or as Python's repr.

    Each piece is rendered again as one private-use character; that second render must be
    ``text`` with each such character standing for its piece.

    >>> tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
    >>> msgs = [{"role": "user", "content": " say <b> "}]
    >>> locate(tmpl, msgs, render(tmpl, msgs), lambda s: [(5, 8)] if s == " say <b> " else [])
    [(10, 13)]
    """
    if _SENTINEL.search(text):
        return None
    fills: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, str):
            spans = pieces(value)
            if not spans:
                return value
            if _SENTINEL_FIRST + len(fills) + len(spans) > _SENTINEL_LAST:
                raise _TooMany
            out, pos = [], 0
            for start, end in spans:
                out.append(value[pos:start])
                out.append(chr(_SENTINEL_FIRST + len(fills)))
                fills.append(value[start:end])
                pos = end
            out.append(value[pos:])
            return "".join(out)
        if isinstance(value, dict):
            return {mark(k): mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [mark(v) for v in value]
        return value

    try:
        marked = mark(messages)
        marked_tools = mark(tools) if tools is not None else None
        skeleton = render(template, marked, add_generation_prompt, bos_token, eos_token,
                          limits=limits, tools=marked_tools)
    except (_TooMany, RecursionError, TemplateError):
        return None
    return _align(skeleton, text, fills)


class _TooMany(Exception):
    """More pieces to locate than there are sentinel characters."""


def _align(skeleton: str, text: str, fills: list[str]) -> list[tuple[int, int]] | None:
    """The spans of ``text`` that the sentinels of ``skeleton`` stand for, when ``text`` is
    ``skeleton`` with each sentinel replaced by its piece, as it is or escaped."""
    parts = _SENTINEL.split(skeleton)  # template text, sentinel, template text, ...
    spans: list[tuple[int, int]] = []
    pos = 0
    for k in range(0, len(parts), 2):
        if not text.startswith(parts[k], pos):
            return None
        pos += len(parts[k])
        if k + 1 == len(parts):
            break
        sentinel = parts[k + 1]
        index = (ord(sentinel) if len(sentinel) == 1 else int(sentinel[2:], 16)) - _SENTINEL_FIRST
        if index >= len(fills):
            return None
        piece, after = fills[index], parts[k + 2]
        # NOTE: the first form followed by the next template text is taken; a choice that
        # turns out wrong later leaves the render unplaced (None), never misplaced
        forms = (piece, json.dumps(piece, ensure_ascii=False)[1:-1], repr(piece)[1:-1])
        for form in dict.fromkeys(forms):
            if text.startswith(form, pos) and text.startswith(after, pos + len(form)):
                break
        else:
            return None
        if spans and spans[-1][1] == pos:
            spans[-1] = (spans[-1][0], pos + len(form))
        else:
            spans.append((pos, pos + len(form)))
        pos += len(form)
    return spans if pos == len(text) else None
