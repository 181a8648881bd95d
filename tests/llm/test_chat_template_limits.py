"""Chat templates come from model files: a hostile one stops with TemplateLimitError naming the
limit it passed (quickly, without a large allocation), any other failure is a TemplateError, and
ordinary templates render exactly as jinja2's own sandbox renders them."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from clops.llm.chat import TemplateError, TemplateLimitError, TemplateLimits, render

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

MESSAGES = [{"role": "system", "content": " Be brief. "},
            {"role": "user", "content": "What's Oxygen?"},
            {"role": "assistant", "content": "An element."},
            {"role": "user", "content": "And hydrogen?"}]
# Only steps can stop these, whatever the load on the machine.
NO_CLOCK = TemplateLimits(seconds=600.0)

HOSTILE = {
    # name: (template, limits, the limit it must pass)
    "huge range": ("{% for i in range(10**9) %}x{% endfor %}", None, "range"),
    "string repetition": ("{{ 'x' * 10**10 }}", None, "chars"),
    "list repetition": ("{{ ([1] * 10000000000)|length }}", None, "chars"),
    "repetition of a big string in a list": (
        "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|join|length }}", None, "chars"),
    "doubling with ~": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", None, "chars"),
    "doubling with +": ("{% set ns = namespace(s=['x']) %}{% for i in range(64) %}"
                        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", None, "chars"),
    "replace growing a string": ("{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                                 "{% set ns.s = ns.s.replace('x', 'xxx') %}{% endfor %}", None,
                                 "chars"),
    "padding filter": ("{{ 'x'|center(10000000000) }}", None, "chars"),
    "padding method": ("{{ 'x'.ljust(10000000000) }}", None, "chars"),
    "format width": ("{{ '{:>10000000000}'.format(1) }}", None, "chars"),
    "printf width": ("{{ '%*d' % (10000000000, 1) }}", None, "chars"),
    "many padded strings": ("{{ range(100000)|map('center', 1000000)|list|length }}", None,
                            "chars"),
    "batch filled to any size": ("{{ [1]|batch(10000000000, 'x')|list|length }}", None, "chars"),
    "integer power": ("{{ 2 ** 100000000 }}", None, "int_bits"),
    "integer squaring": ("{% set ns = namespace(x=3) %}{% for i in range(64) %}"
                         "{% set ns.x = ns.x * ns.x %}{% endfor %}", None, "int_bits"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", NO_CLOCK, "steps"),
    "nested loops over a list": ("{% set r = range(100000)|list %}{% for a in r %}"
                                 "{% for b in r %}{% endfor %}{% endfor %}", NO_CLOCK, "steps"),
    "text from nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                               "0123456789{% endfor %}{% endfor %}", NO_CLOCK, "output"),
    "text of a macro from nested loops": (
        "{% macro m() %}{% for i in range(10000) %}{% for j in range(100) %}"
        "{{ '0123456789' * 10000 }}{% endfor %}{% endfor %}{% endmacro %}{{ m()|length }}",
        NO_CLOCK, "chars"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", None, "depth"),
    "recursive loop": ("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}", None,
                       "depth"),
    "recursive block": ("{% block a %}{{ self.a() }}{% endblock %}", None, "depth"),
    "exponential recursion": ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}"
                              "{% endif %}{% endmacro %}{{ f(40) }}",
                              TemplateLimits(seconds=600.0, steps=20_000), "steps"),
    "huge source": ("x" * (TemplateLimits().template + 1), None, "template"),
}


# Unguarded, most of these would take gigabytes; guarded, none needs more than 24 MiB.
PEAK_BYTES = 128 << 20


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_stops_at_its_limit(name):
    template, limits, limit = HOSTILE[name]
    traced = limit != "steps"  # (tracemalloc slows the step-bound ones, which make little)
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(TemplateLimitError) as info:
            render(template, MESSAGES, limits=limits)
        peak = tracemalloc.get_traced_memory()[1] if traced else 0
    finally:
        if traced:
            tracemalloc.stop()
    assert info.value.limit == limit, str(info.value)
    assert f"TemplateLimits.{limit}" in str(info.value)
    assert time.perf_counter() - t0 < 30
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB"


def test_wall_clock_limit():
    slow = ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
            "{{ f(40) }}")
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError) as info:
        render(slow, MESSAGES, limits=TemplateLimits(seconds=0.3, steps=10**12))
    assert info.value.limit == "seconds"
    assert "0.3 s" in str(info.value)
    assert time.perf_counter() - t0 < 10


def test_default_limits_stop_nested_loops_quickly():
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError) as info:
        render(HOSTILE["nested loops"][0], MESSAGES)
    assert info.value.limit in ("steps", "seconds")
    assert time.perf_counter() - t0 < 3 * TemplateLimits().seconds


def test_limits_can_be_changed():
    assert render("{{ range(10)|list|length }}", [], limits=TemplateLimits(range=10)) == "10"
    with pytest.raises(TemplateLimitError, match="range"):
        render("{{ range(11)|list|length }}", [], limits=TemplateLimits(range=10))
    with pytest.raises(TemplateLimitError, match="output"):
        render("{{ messages[1].content }}", MESSAGES, limits=TemplateLimits(output=5))


@pytest.mark.parametrize("template, message", [
    ("{% for %}", "does not parse"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% include 'other.jinja' %}", "failed"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ messages.append(1) }}", "unsafe"),
    ("{{ lipsum(1000000) }}", "undefined"),
    ("{{ ([[1]] * 1000)|sum(start=[]) }}", "only numbers"),
    ("{{ raise_exception('no system role here') }}", "no system role here"),
])
def test_failing_template_is_a_template_error(template, message):
    with pytest.raises(TemplateError, match=message) as info:
        render(template, MESSAGES)
    assert not isinstance(info.value, TemplateLimitError)


ORDINARY = [
    # loops, loop variables, conditions, whitespace control, namespaces
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m.role == 'system' %}{% set ns.system = ns.system ~ m.content|trim %}{% endif %}"
    "{% endfor %}[{{ ns.system }}]\n"
    "{%- for m in messages if m.role != 'system' %}\n  {{ loop.index }}/{{ loop.length }} "
    "<|{{ m['role'] }}|>{{ m.content + eos_token }}{% if loop.last %}!{% endif %}\n"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
    # macros, caller, recursive loops, else branches
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
    "{% call wrap('b') %}{{ messages|length }}{% endcall %}"
    "{% for x in [1, [2, [3]], 4] recursive %}({% if x is iterable %}{{ loop(x) }}"
    "{% else %}{{ x }}{% endif %}){% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}",
    # operators, formatting and the filters the guards look at
    "{{ 'ab' * 3 }} {{ [1, 2] * 2 }} {{ 2 ** 10 }} {{ 7 % 3 }} {{ '%s=%05.1f' % ('x', 2.5) }}"
    " {{ '{}|{:>6}|{name}'.format('a', 12, name='n') }} {{ 'a\tb'.expandtabs(4) }}"
    " {{ 'x'|center(7) }}. {{ 'a\nb'|indent(2, true) }} {{ 'a-b-c'|replace('-', '+') }}"
    " {{ range(5)|join(',') }} {{ [1, 2, 3]|sum }} {{ 'ab'.ljust(4, '.') }}"
    " {{ [1, 2, 3, 4, 5]|batch(2, 0)|list }} {{ 'one two'|wordwrap(3) }} {{ messages|tojson }}"
    " {% set block %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ block }}"
    " {% filter upper %}loud {{ 'text' }}{% endfilter %} {{ 'a' ~ 1 ~ none }}",
]


def _jinja_reference(template: str) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    # chat templates' tojson (as transformers defines it): keys in order, a plain string
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False,
                                                              indent=indent)
    return env.from_string(template).render(messages=MESSAGES, add_generation_prompt=True,
                                            bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("template", ORDINARY, ids=["loops", "macros", "operators"])
def test_ordinary_template_renders_as_jinja_does(template):
    want = _jinja_reference(template)
    assert want  # the reference rendered something to compare with
    assert render(template, MESSAGES, True, "<s>", "</s>") == want


def test_loop_controls_render_as_transformers_renders_them():
    tmpl = ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
            "{% if loop.index > 3 %}{% break %}{% endif %}<{{ m['content'] }}>{% endfor %}")
    msgs = [{"role": r, "content": c} for r, c in
            [("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c")]]
    assert render(tmpl, msgs, False) == "<a><b>"
