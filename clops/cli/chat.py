"""cli, chat: ``clops chat``, a conversation with the model in the terminal.

Each reply is generated over the whole conversation so far (the model's chat template over every
turn) and streamed as it comes. ``/clear`` forgets the conversation (the system prompt stays),
``/exit`` or Ctrl-D ends it, Ctrl-C during a reply stops that reply and keeps the rest. A line
ending in ``\\`` goes on on the next line. Works with stdin that is not a terminal (one message a
line; the replies alone go to stdout), so ``printf 'Hi\\n' | clops chat`` is a one-turn chat.
When the conversation outgrows the context, its oldest exchanges are left out, with a note."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Generator
from typing import IO, TYPE_CHECKING, Any, cast

from . import args as cli

if TYPE_CHECKING:
    from ..llm import Model

PROG = "clops chat"
DESCRIPTION = """\
Talk with the model. Each reply is generated over the whole conversation so far and streamed
as it comes. Type a message and Enter (a line ending in \\ goes on on the next line);
/clear forgets the conversation, /exit or Ctrl-D ends it, Ctrl-C stops a reply. With stdin not
a terminal, each line is a message and only the replies go to stdout, one after another.

example: clops chat -sys "You are terse." -c 8192"""
COMMANDS = {"/exit": "end the chat (also /quit, Ctrl-D)", "/quit": None,
            "/clear": "forget the conversation (the system prompt stays)",
            "/help": "list these commands"}
_COMMAND = re.compile(r"/\w+")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = cli.Parser(prog=prog, description=DESCRIPTION,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-sys", "--system-prompt", type=cli.text("system prompt"), default=None,
                   metavar="TEXT", help="a system message that opens the conversation")
    p.add_argument("-n", "--n-predict", type=cli.whole(1), default=None, metavar="N",
                   help="new tokens a reply at most (default: the rest of the context)")
    cli.add_model_options(p, ctx_default=4096,
                          ctx_help="tokens of context: the conversation the model sees")
    cli.add_sampling_options(p)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no banner, load progress or notes on stderr")
    return p


class Chat:
    """A conversation with ``model``: the messages so far, and a reply to each new one."""

    def __init__(self, model: Model, system: str | None = None, n_predict: int | None = None,
                 sampling: dict[str, Any] | None = None, out: IO[str] | None = None,
                 note: Callable[[str], None] | None = None) -> None:
        self.model = model
        self.system = system
        self.n_predict = n_predict
        self.sampling = sampling or {}
        self.out = out or sys.stdout
        self.note = note or (lambda text: print(f"[{text}]", file=sys.stderr))
        self.history: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.history = [] if self.system is None else [{"role": "system", "content": self.system}]

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self.model.tokenizer.encode_chat(messages, add_generation_prompt=True))

    def _fit(self, message: dict[str, str]) -> list[dict[str, str]] | None:
        """The history and ``message``, less the oldest exchanges that leave no room for a
        reply in the context; None (with a note) when ``message`` alone leaves none."""
        head = self.history[:1] if self.system is not None else []
        turns = self.history[len(head):]
        dropped = 0
        while True:
            messages = head + turns + [message]
            n = self.prompt_tokens(messages)
            if n < self.model.max_seq:
                break
            if not turns:
                self.note(f"error: this message takes {n} tokens with the system prompt, no "
                          f"room for a reply in the context of {self.model.max_seq}: "
                          f"{cli.context_advice(self.model)}")
                return None
            turns = turns[2:]  # a user message and its reply
            dropped += 1
        if dropped:
            self.note(f"the conversation outgrew the context of {self.model.max_seq} tokens: "
                      f"its oldest {dropped} exchange(s) are left out")
        return messages

    def say(self, text: str) -> str | None:
        """Stream the reply to ``text`` to ``out`` and keep both in the history; None when
        ``text`` does not fit. Ctrl-C stops the reply: what came so far is kept."""
        messages = self._fit({"role": "user", "content": text})
        if messages is None:
            return None
        budget = self.model.max_seq if self.n_predict is None else self.n_predict
        pieces: list[str] = []
        stopped = False
        reply: Generator[str, None, None] | None = None
        try:
            # (one conversation is one prompt: its pieces come as a generator)
            reply = cast(Generator[str, None, None], self.model.generate(
                messages, max_new_tokens=budget, **self.sampling))
            for piece in reply:
                self.out.write(piece)
                self.out.flush()
                pieces.append(piece)  # (kept once shown: the history is what was read)
        except KeyboardInterrupt:
            stopped = True
        except ValueError as e:  # what the model could not do with the text
            self.out.write("\n")
            self.note(f"error: {cli.one_line(str(e))}")
            return None
        finally:
            if reply is not None:  # (frees the model for the next reply, however this ended)
                reply.close()
        self.out.write("\n")
        self.out.flush()
        if stopped:
            self.note("reply stopped; /exit or Ctrl-D ends the chat")
        answer = "".join(pieces)
        self.history = messages + [{"role": "assistant", "content": answer}]
        return answer


def converse(chat: Chat, read: Callable[[], str | None]) -> int:
    """Talk until ``/exit`` or the end of input; ``read`` gives the next line (None at the end;
    it raises ValueError for a line that is not text, KeyboardInterrupt for Ctrl-C)."""
    while True:
        try:
            line = _message(read)
        except KeyboardInterrupt:  # at the prompt: drop the line, keep the chat
            continue
        except ValueError as e:
            chat.note(f"error: {e}: the line was left out")
            continue
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if _COMMAND.fullmatch(text):
            if text in ("/exit", "/quit"):
                return 0
            if text == "/clear":
                chat.clear()
                chat.note("the conversation is forgotten")
            elif text == "/help":
                chat.note("; ".join(f"{c}: {what}" for c, what in COMMANDS.items() if what))
            else:
                chat.note(f"unknown command {text}: /help lists them")
            continue
        chat.say(text)


def _message(read: Callable[[], str | None]) -> str | None:
    """One message: a line, and the next ones while a line ends in a backslash."""
    parts: list[str] = []
    while True:
        line = read()
        if line is None:
            return "\n".join(parts) if parts else None
        line = line.rstrip("\r\n")
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        return "\n".join(parts)


def terminal_reader(prompt: str = "> ") -> Callable[[], str | None]:
    """Lines typed at a terminal, with line editing where ``readline`` is there."""
    try:
        import readline  # noqa: F401 (input() edits lines once it is imported)
    except ImportError:
        pass

    def read() -> str | None:
        try:
            line = input(prompt)
        except EOFError:
            print()
            return None
        except KeyboardInterrupt:
            print()  # (off the line of the prompt)
            raise
        return cli.utf8("line", line)

    return read


def stream_reader(stream: IO[bytes]) -> Callable[[], str | None]:
    """Lines of a byte stream (a pipe, a file), each refused unless it is UTF-8."""

    def read() -> str | None:
        raw = stream.readline()
        if not raw:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"the line is not valid UTF-8 text (byte {e.start})") from None

    return read


def _run(args: argparse.Namespace) -> int:
    cli.check_model_path(args.model)
    device = cli.open_device(args.device)
    t0 = time.perf_counter()
    model = cli.load_model(args.model, device, args.ctx_size, not args.quiet, args.kv_cache,
                           args.tensor_split)

    def note(text: str) -> None:
        if not args.quiet or text.startswith("error:"):
            print(f"[{text}]", file=sys.stderr, flush=True)

    chat = Chat(model, args.system_prompt, args.n_predict, cli.sampling(args), note=note)
    try:
        chat.prompt_tokens(chat.history + [{"role": "user", "content": "Hi"}])
    except ValueError as e:  # a model without a chat template, or one that fails
        raise cli.Refused(str(e)) from None
    note(f"{model.config.arch} from {model.source_path} on {model.where}, loaded in "
         f"{time.perf_counter() - t0:.1f} s; context {model.max_seq} tokens. /clear forgets "
         "the conversation, /exit or Ctrl-D ends it, Ctrl-C stops a reply")
    tty = sys.stdin.isatty()
    return converse(chat, terminal_reader() if tty else stream_reader(sys.stdin.buffer))


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return cli.guarded(prog, lambda: _run(args))
