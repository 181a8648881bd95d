"""llm, chat: renders a model's Jinja chat template in a sandbox."""

from __future__ import annotations

import functools
from datetime import date
from typing import Any


class TemplateError(ValueError):
    """The chat template rejected the conversation (it called raise_exception)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


@functools.cache
def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
    return env


def render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "") -> str:
    """The prompt text for ``messages`` ([{"role": ..., "content": ...}, ...])."""
    tmpl = _environment().from_string(template)
    return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                       bos_token=bos_token, eos_token=eos_token)
