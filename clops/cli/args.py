"""cli, arguments: the options every model subcommand spells alike (llama.cpp's spellings), the
checks of their values, and the one-line refusal (status 2) of a mistake, before a model loads
where it can."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..llm import Model
    from ..runtime import CLDevice

USAGE_ERROR = 2
INT32_MAX = 2**31 - 1
SEED_END = 2**32
# NOTE: the sampler divides by the temperature in float32: below about 1e-38 that overflows and
# the text is garbage (seen at 1e-38); anything this close to 0 is greedy anyway
MIN_TEMPERATURE = 1e-6
KV_CACHE_TYPES = ("float16", "float32")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see --help)\n")


class Refused(Exception):
    """What the user asked cannot be done; the message says why."""


def one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


# -- values ------------------------------------------------------------------------------------
def utf8(what: str, raw: str) -> str:
    """``raw`` if it is valid UTF-8 (Python keeps other bytes of argv and stdin as surrogates),
    else ValueError naming ``what``."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the {what} is not valid UTF-8 text ({raw!r}): pass UTF-8") from None
    return raw


def text(what: str) -> Callable[[str], str]:
    """Non-empty text that is valid UTF-8."""

    def parse(raw: str) -> str:
        if not raw:
            raise argparse.ArgumentTypeError(f"the {what} is empty")
        try:
            return utf8(what, raw)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def path(raw: str) -> str:
    if not raw:
        raise argparse.ArgumentTypeError("the path is empty")
    return raw


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    span = f"a whole number >= {low}" if high is None else \
        f"a whole number from {low} to {high}"

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {span}")
        return value

    return parse


def shares(raw: str) -> list[float]:
    """``3,1``: positive numbers, comma-separated (a device's share of the layers)."""
    out = []
    for part in raw.split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{raw!r}: give positive numbers separated by commas, one a device, such as "
                "3,1") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{raw!r}: each share must be a positive number")
        out.append(value)
    return out


def number(low: float, high: float | None = None, low_open: bool = False
           ) -> Callable[[str], float]:
    if high is None:
        span = f"a number {'>' if low_open else '>='} {low:g}"
    else:
        span = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        above_low = value > low if low_open else value >= low
        if not (math.isfinite(value) and above_low and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"{raw} is out of range: give {span}")
        return value

    return parse


def temperature(raw: str) -> float:
    value = number(0.0)(raw)
    if 0.0 < value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"{raw} is out of range: give 0 (greedy) or a number >= {MIN_TEMPERATURE:g}")
    return value


# -- options -----------------------------------------------------------------------------------
def hidden_alias(p: argparse._ActionsContainer, spelling: str, dest: str, **kw: Any) -> None:
    """An older spelling of an option that still works but is not listed in --help (its errors
    name the spelling the user typed)."""
    p.add_argument(spelling, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kw)


def add_model_options(p: argparse.ArgumentParser, ctx_default: int | None, ctx_min: int = 1,
                      ctx_help: str = "tokens of context to allocate") -> None:
    """-m/--model, -c/--ctx-size (old spelling --ctx), --device, --kv-cache."""
    g = p.add_argument_group("model and device")
    g.add_argument("-m", "--model", type=path, metavar="PATH",
                   help="a .gguf file or a Hugging Face safetensors directory "
                        "(default: the bundled SmolLM2-135M-Instruct)")
    shown = "" if ctx_default is None else f" (default {ctx_default})"
    g.add_argument("-c", "--ctx-size", type=whole(ctx_min), default=ctx_default, metavar="N",
                   help=ctx_help + shown)
    hidden_alias(g, "--ctx", "ctx_size", type=whole(ctx_min))
    g.add_argument("--device", type=text("device selector"), default=None, metavar="SEL",
                   help="OpenCL device selector: gpu, cpu, nvidia, pocl, opencl:0:1 ... "
                        "(default: CLOPS_DEVICE or the best device; `clops info` lists them); "
                        "several, comma-separated (gpu:0,gpu:1), split the model's layers "
                        "over them")
    g.add_argument("-ts", "--tensor-split", type=shares, default=None, metavar="N0,N1,...",
                   help="each device's share of the layers, with several devices (default: in "
                        "proportion to their free memory)")
    g.add_argument("--kv-cache", choices=KV_CACHE_TYPES, default=None,
                   help="type of the KV cache (default: float16 on GPUs, float32 on CPUs)")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """--temp (old spelling --temperature), --top-k, --top-p, --min-p, --repeat-penalty,
    -s/--seed, --stop."""
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", type=temperature, default=0.0, metavar="T",
                   help=f"temperature: 0 is greedy (default), else at least {MIN_TEMPERATURE:g}")
    hidden_alias(g, "--temperature", "temp", type=temperature)
    g.add_argument("--top-k", type=whole(0, INT32_MAX), default=0, metavar="K",
                   help="keep the k likeliest tokens (default 0: all)")
    g.add_argument("--top-p", type=number(0.0, 1.0, low_open=True), default=1.0, metavar="P",
                   help="nucleus sampling mass, in (0, 1] (default 1)")
    g.add_argument("--min-p", type=number(0.0, 1.0), default=0.0, metavar="P",
                   help="drop tokens below min-p * the likeliest's p, in [0, 1] (default 0)")
    g.add_argument("--repeat-penalty", type=number(0.0, low_open=True), default=1.0,
                   metavar="X", help="repetition penalty (default 1: none)")
    g.add_argument("-s", "--seed", type=whole(0, SEED_END - 1), default=None, metavar="N",
                   help="seed of the sampler, 0 to 2**32-1 (default: a new one each run)")
    g.add_argument("--stop", action="append", default=[], type=text("stop string"),
                   metavar="TEXT", help="stop at this text (repeatable)")


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``Model.generate`` that the sampling options give."""
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repeat_penalty, seed=args.seed, stop=args.stop)


# -- the model ---------------------------------------------------------------------------------
def check_model_path(model: str | None) -> None:
    """Refuse a model file that is not there (or no bundled model), before the device opens."""
    if model is None:
        from ..llm import default_model_path

        try:
            default_model_path()
        except FileNotFoundError as e:
            raise Refused(str(e)) from None
    elif not os.path.exists(model):
        from ..llm import hub

        if hub.parse(model) is None:
            raise Refused(f"no model at {model!r}: give a .gguf file, a model directory or a "
                          "Hugging Face id (org/name) with -m, or leave -m out for the bundled "
                          "SmolLM2")
        try:  # a hub id: found in the local cache (or fetched, when not offline) before the
            hub.resolve(model)  # device opens
        except (OSError, ValueError) as e:
            raise Refused(str(e)) from None


def open_device(selector: str | None) -> CLDevice | list[CLDevice]:
    """The device of ``--device``, or the devices of a comma-separated list (the devices of each
    platform in one context)."""
    from ..llm import placement

    try:
        devs = placement.devices(selector)
    except (LookupError, ValueError) as e:
        raise Refused(str(e)) from None
    return devs if len(devs) > 1 else devs[0]


def load_model(model: str | None, device: CLDevice | list[CLDevice], ctx_size: int | None,
               progress: bool, kv_cache: str | None,
               split: list[float] | None = None) -> Model:
    from .. import llm

    if split is not None and (not isinstance(device, list) or len(split) != len(device)):
        count = len(device) if isinstance(device, list) else 1
        raise Refused(f"--tensor-split gives {len(split)} shares for {count} device(s): give "
                      "one share a device, and several devices in --device (gpu:0,gpu:1)")
    try:
        return llm.load(model, device=device, max_seq_len=ctx_size, progress=progress,
                        kv_cache=kv_cache, split=split)
    except (OSError, ValueError, LookupError) as e:
        raise Refused(str(e)) from None


def context_advice(model: Model) -> str:
    """What to do when text does not fit ``model``'s context."""
    most = model.config.context_length or model.max_seq
    if model.max_seq >= most:
        return "shorten the text"
    return f"raise -c/--ctx-size (this model allows up to {most}) or shorten the text"


def guarded(prog: str, body: Callable[[], int]) -> int:
    """Run a subcommand's body: a ``Refused`` is one line on stderr and status 2, Ctrl-C
    status 130, a reader that went away (``| head``) status 1."""
    try:
        return body()
    except Refused as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
