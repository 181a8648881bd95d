"""Providers, choice: the registry of providers, the ``CLOPS_PROVIDERS`` policy, and the choice
per call between providers and generated kernels, measured once per (op, shape class, dtype,
device) and remembered on disk."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _config
from ..kernels.operand import dtype_name
from ..runtime import cachefiles, profiler, scope
from .base import Provider

if TYPE_CHECKING:
    from ..runtime.device import CLDevice

GENERATED = "generated"

_REGISTRY: dict[str, Provider] = {}
_LOCK = threading.RLock()


def register(provider: Provider) -> Provider:
    """Add a provider (its ``name`` must be new). Providers are tried in registration order."""
    with _LOCK:
        if provider.name in _REGISTRY and _REGISTRY[provider.name] is not provider:
            raise ValueError(f"a provider named {provider.name!r} is already registered")
        _REGISTRY[provider.name] = provider
        _POLICIES.clear()
    return provider


def unregister(name: str) -> None:
    with _LOCK:
        _REGISTRY.pop(name, None)
        _POLICIES.clear()


def get(name: str) -> Provider:
    """The registered provider called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no provider named {name!r}; known: {sorted(_REGISTRY)}") from None


def providers() -> list[Provider]:
    """Every registered provider, available or not."""
    return list(_REGISTRY.values())


# -- CLOPS_PROVIDERS ----------------------------------------------------------------------------
AUTO, DENY, FORCE = "auto", "deny", "force"


@dataclass(frozen=True)
class Policy:
    """What ``CLOPS_PROVIDERS`` says about each provider: ``auto`` (chosen by cost when
    capable), ``deny`` (never) or ``force`` (whenever capable, without measuring)."""

    default: str = AUTO
    modes: dict[str, str] = field(default_factory=dict)

    def mode(self, name: str) -> str:
        return self.modes.get(name, self.default)


def parse_policy(text: str | None, known: Iterable[str] | None = None) -> Policy:
    """Read a ``CLOPS_PROVIDERS`` value: comma-separated items, later ones win.

    - ``all`` (or ``auto``, or unset): every provider may be chosen, by cost;
    - ``none``: no provider; generated kernels only;
    - ``NAME``: may be chosen, by cost; bare names form an allow-list (providers not named are
      denied) unless ``all`` is also given;
    - ``-NAME``: denied;
    - ``+NAME`` or ``NAME!``: forced: used whenever it can do the op, without measuring.

    >>> parse_policy("clblast,-vkfft").mode("vkfft")
    'deny'
    >>> parse_policy("+clblast").mode("vkfft"), parse_policy("+clblast").mode("clblast")
    ('auto', 'force')
    """
    known_set = set(known) if known is not None else None
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    default = AUTO
    modes: dict[str, str] = {}
    bare = False
    explicit_all = False
    for item in items:
        low = item.lower()
        if low in ("all", "auto"):
            default, explicit_all = AUTO, True
            continue
        if low == "none":
            default = DENY
            modes.clear()
            continue
        if low.startswith("+"):
            name, mode = low[1:], FORCE
        elif low.endswith("!"):
            name, mode = low[:-1], FORCE
        elif low.startswith("-"):
            name, mode = low[1:], DENY
        else:
            name, mode, bare = low, AUTO, True
        name = name.strip()
        if known_set is not None and name not in known_set:
            raise ValueError(
                f"CLOPS_PROVIDERS={text!r}: unknown provider {name!r}; known providers: "
                f"{', '.join(sorted(known_set)) or 'none'} (syntax: 'all', 'none', 'NAME', "
                "'-NAME' to deny, '+NAME' or 'NAME!' to force)")
        modes[name] = mode
    if bare and not explicit_all:
        default = DENY
    return Policy(default, modes)


_POLICIES: dict[str | None, Policy] = {}


def policy() -> Policy:
    """The policy of the current ``CLOPS_PROVIDERS`` (read through ``clops._config``)."""
    text = _config.CONFIG.providers
    pol = _POLICIES.get(text)
    if pol is None:
        pol = _POLICIES[text] = parse_policy(text, _REGISTRY)
    return pol


# -- measured choices, remembered ---------------------------------------------------------------
def shape_class(shape_key: Iterable[int]) -> tuple[int, ...]:
    """Each size rounded up to a power of two: calls in one class share one measurement.

    >>> shape_class((100, 256, 3))
    (128, 256, 4)
    """
    return tuple(1 << max(int(n) - 1, 0).bit_length() if n > 0 else 0 for n in shape_key)


@dataclass
class Decision:
    """One choice: which implementation, why, and the measured seconds per implementation."""

    op: str
    dtype: str
    shape_class: tuple[int, ...]
    device: str
    choice: str  # a provider name or "generated"
    reason: str  # "forced" | "only" | "measured" | "cached" | "none capable"
    costs: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        costs = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(self.costs.items())
                          if math.isfinite(v))
        shape = "x".join(map(str, self.shape_class))
        return (f"{self.op} {self.dtype} [{shape}] on {self.device}: {self.choice} "
                f"({self.reason}{'; ' + costs if costs else ''})")


_COSTS: dict[str, dict[str, float]] | None = None
_DECISIONS: dict[tuple[str, str], Decision] = {}  # (key, candidate set) -> decision
_ANNOUNCED: set[str] = set()


def _cache_path() -> str:
    from ..runtime.device import cache_dir

    return os.path.join(cache_dir(), "providers.json")


def _costs() -> dict[str, dict[str, float]]:
    global _COSTS
    if _COSTS is None:
        _COSTS = {}
        if _config.CONFIG.disk_cache:
            try:
                data = json.loads(cachefiles.read_file(_cache_path(), 1 << 24))
            except (OSError, ValueError, RecursionError):  # missing, a pipe, garbage
                data = {}
            # entry by entry: a bad one (a list, a string cost) is dropped, not the table
            for k, v in (data.items() if isinstance(data, dict) else ()):
                if isinstance(k, str) and isinstance(v, dict):
                    _COSTS[k] = {n: float(c) for n, c in v.items()
                                 if isinstance(n, str) and type(c) in (int, float)}
    return _COSTS


def _save() -> None:
    if not _config.CONFIG.disk_cache or _COSTS is None:
        return
    # NOTE: json has no infinity; a failed measurement is stored as a huge number.
    text = json.dumps({k: {n: (c if math.isfinite(c) else 1e30) for n, c in v.items()}
                       for k, v in _COSTS.items()}, indent=1, sort_keys=True)
    cachefiles.write_file(_cache_path(), text.encode())


def clear_choices(disk: bool = False) -> None:
    """Forget the choices of this process (and, with ``disk=True``, the measured costs on
    disk)."""
    global _COSTS
    with _LOCK:
        _DECISIONS.clear()
        _ANNOUNCED.clear()
        _COSTS = {}
        if disk:
            try:
                os.remove(_cache_path())
            except OSError:
                pass
        else:
            _COSTS = None


def choices() -> list[Decision]:
    """The decisions made in this process, one per (op, dtype, shape class, device)."""
    return list(_DECISIONS.values())


def _cost_key(op: str, device: CLDevice, dtype: str, cls: tuple[int, ...]) -> str:
    return f"{device.key}|{op}|{dtype}|{'x'.join(map(str, cls))}"


def _announce(decision: Decision, key: str) -> None:
    if _config.CONFIG.debug >= 1 and key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        print(f"clops: provider choice: {decision.describe()}", file=sys.stderr)
    if scope.profiling():
        profiler.record(f"choose {decision.op}: {decision.choice}", "marker", decision.device,
                        None, op=decision.op, choice=decision.choice, reason=decision.reason,
                        shape_class=list(decision.shape_class), dtype=decision.dtype)


def capable(op: str, device: CLDevice, dtype: str,
            shape_key: tuple[int, ...] | None = None) -> list[tuple[Provider, str]]:
    """The providers ``CLOPS_PROVIDERS`` allows that can run ``op`` on ``dtype`` (and shape)
    here, with their policy mode; the others are explained under ``CLOPS_DEBUG>=2``."""
    pol = policy()
    out = []
    for p in _REGISTRY.values():
        spec = p.spec(op)
        if spec is None:
            continue
        mode = pol.mode(p.name)
        why = "denied by CLOPS_PROVIDERS" if mode == DENY else p.cannot(op, device, dtype)
        only = spec.forced_only.get(dtype)
        if why is None and only is not None and mode != FORCE:
            why = f"{only} (taken only when forced: CLOPS_PROVIDERS=+{p.name})"
        if why is None and shape_key is not None:
            why = p.cannot_shape(op, shape_key)
        if why is not None:
            if _config.CONFIG.debug >= 2:
                print(f"clops: provider {p.name} skipped for {op} {dtype} on {device.name}: "
                      f"{why}", file=sys.stderr)
            continue
        out.append((p, mode))
    return out


def forces_any() -> bool:
    """Whether ``CLOPS_PROVIDERS`` forces a provider (``+NAME``); without one, ``forced`` is
    None for every op."""
    pol = policy()
    return pol.default == FORCE or FORCE in pol.modes.values()


def forced(op: str, device: CLDevice, dtype: Any, shape_key: Iterable[int]) -> Provider | None:
    """The provider ``CLOPS_PROVIDERS`` forces (``+NAME``) for ``op`` here, if one is capable:
    it takes the op at any size, ahead of clops' own kernels."""

    for p, mode in capable(op, device, dtype_name(dtype), tuple(int(n) for n in shape_key)):
        if mode == FORCE:
            return p
    return None


def choose(op: str, device: CLDevice, dtype: Any, shape_key: Iterable[int],
           generated_cost: Callable[[], float] | None = None) -> Provider | None:
    """The provider to run ``op`` with, or ``None`` for the generated kernel.

    Capability first (library present, op, dtype and its device extensions, backend, driver,
    ``CLOPS_PROVIDERS``); a forced provider is taken as is; else the cheapest of the capable
    providers and, when ``generated_cost`` is given, the generated kernel. Costs are measured
    once per (op, dtype, shape class, device), on a warm call each, and kept on disk
    (``<cache dir>/providers.json``). ``generated_cost()`` returns the seconds one generated
    call takes; time it with :func:`clops.providers.measure` so that both sides are timed
    alike. Without it, a capable provider is used (the cheapest by estimate when several).

    >>> p = choose("gemm", dev, "float32", (m, n, k), lambda: measure(run_generated, dev))
    >>> p.gemm(dev, a, b, c) if p is not None else run_generated()
    """

    dt = dtype_name(dtype)
    key_shape = tuple(int(n) for n in shape_key)
    cands = capable(op, device, dt, key_shape)
    cls = shape_class(key_shape)
    key = _cost_key(op, device, dt, cls)
    names = tuple(f"{p.name}:{mode}" for p, mode in cands) + ((GENERATED,) if generated_cost
                                                                else ())
    memo = _DECISIONS.get((key, "|".join(names)))
    if memo is not None:
        if scope.profiling():
            _announce(memo, key)
        return None if memo.choice == GENERATED else get(memo.choice)
    with _LOCK:
        decision = _decide(op, device, dt, key_shape, cls, key, cands, generated_cost)
        _DECISIONS[(key, "|".join(names))] = decision
    _announce(decision, key)
    return None if decision.choice == GENERATED else get(decision.choice)


def _decide(op: str, device: CLDevice, dtype: str, shape: tuple[int, ...],
            cls: tuple[int, ...], key: str, cands: list[tuple[Provider, str]],
            generated_cost: Callable[[], float] | None) -> Decision:
    def make(choice: str, reason: str, costs: dict[str, float] | None = None) -> Decision:
        return Decision(op, dtype, cls, device.name, choice, reason, costs or {})

    if not cands:
        return make(GENERATED, "none capable")
    forced = [p for p, mode in cands if mode == FORCE]
    if forced:
        return make(forced[0].name, "forced")
    if generated_cost is None:
        if len(cands) == 1:
            return make(cands[0][0].name, "only")
        est = {p.name: p.estimate(op, device, dtype, shape) for p, _ in cands}
        return make(min(est, key=lambda n: est[n]), "estimated", est)
    stored = _costs().setdefault(key, {})
    fresh = False
    for p, _ in cands:
        if p.name not in stored:
            try:
                stored[p.name] = p.measure(op, device, dtype, shape)
            except Exception as e:  # noqa: BLE001 - a provider that fails is not chosen
                stored[p.name] = math.inf
                if _config.CONFIG.debug >= 1:
                    print(f"clops: provider {p.name} failed on {op} {dtype} {shape} on "
                          f"{device.name}: {e}", file=sys.stderr)
            fresh = True
    if GENERATED not in stored:
        try:
            stored[GENERATED] = float(generated_cost())
        except Exception as e:  # noqa: BLE001
            stored[GENERATED] = math.inf
            if _config.CONFIG.debug >= 1:
                print(f"clops: generated {op} failed while measuring: {e}", file=sys.stderr)
        fresh = True
    if fresh:
        _save()
    names = [p.name for p, _ in cands] + [GENERATED]
    costs = {n: stored[n] for n in names}
    best = min(names, key=lambda n: costs[n])  # ties go to the provider listed first
    return make(best, "measured" if fresh else "cached", costs)


def report(device: CLDevice) -> str:
    """One line per registered provider: available or why not, and what it can do here."""
    lines = []
    pol = policy()
    for p in _REGISTRY.values():
        why = p.unavailable_reason()
        if why is not None:
            lines.append(f"{p.name:<8} unavailable: {why}")
            continue
        serve = p.serves(device)
        ops = []
        for s in p.specs:
            ok = [d for d in sorted(s.dtypes) if p.cannot(s.op, device, d) is None]
            if ok:
                ops.append(f"{s.op}[{','.join(ok)}]")
        state = serve or " ".join(ops) or "nothing on this device"
        lines.append(f"{p.name:<8} {pol.mode(p.name):<5} {state}")
    return "\n".join(lines)
