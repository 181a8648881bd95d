"""Profiling the decode layer kernel (``kernels/layer.cl``'s ``decode_layers``) on a GPU that
runs it (NVIDIA: its grid-barrier probe passes):

    python bench/profile_layers.py depths MODEL.gguf [--depths 128,4096] [--variant SPEC]...
    python bench/profile_layers.py trace MODEL.gguf [--depths 128,16384] [--variant SPEC]...

``depths``: decode tok/s (the median of ``--runs`` generations of ``--new`` tokens) after each
number of context tokens, for each variant in turn at each depth (alternate them, as
``--variant A --variant B --variant A``, to see the machine's drift), beside the per-layer plan
(``--variant plan``). A SPEC is ``NAME=V;NAME=V`` -D defines of the kernel
(``layer.EXTRA_DEFINES``: a switch under test, or PHASES; MAX_LAYERS: layers a launch at most;
SLOTS, SLOTS_LONG: the registers' slots, ``layer.SLOTS`` and for long spans ``layer.SLOTS_LONG``),
or empty for the kernel as it is.

``trace``: per phase of a layer (A QKV, B attention, C output, D gate/up, E down; D gate/up with
down where the down projection runs inside it, layer.cl's DFUSE) the median
and the slowest work-group's time from leaving one grid barrier to arriving at the next, and
the barrier's release (the median work-group's leaving after the last one arrived), from the
GPU clock each work-group writes at its barriers (``layer.TRACE``); medians over the layers of
the last step's launches.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import clops
import clops.llm
from clops.kernels import layer

PHASES = "ABCDE"


def _defines(spec: str) -> dict[str, int]:
    out = {}
    for kv in filter(None, spec.split(";")):
        name, _, value = kv.partition("=")
        out[name.strip()] = int(value)
    return out


def _load(path: str, device: str, longest: int, new: int):
    model = clops.llm.load(path, device=device, max_seq_len=longest + new + 8, progress=False)
    if not model._builder.whole_layers():
        sys.exit(f"{path}: the layer kernel does not run this model on {model.device.name}")
    ids = np.random.default_rng(0).integers(100, model.config.vocab_size - 1, longest).tolist()
    return model, ids


_MOST, _SLOTS, _SLOTS_LONG = layer.MAX_LAYERS, layer.SLOTS, layer.SLOTS_LONG


def _use(model, spec: str) -> None:
    """The next step's plan from the layer kernel built with ``spec`` (or the per-layer plan);
    MAX_LAYERS in a spec caps the layers a launch (``layer.MAX_LAYERS``), SLOTS and SLOTS_LONG
    set the registers' slots (``layer.SLOTS``, ``layer.SLOTS_LONG``), not -D defines."""
    model._builder.whole = spec != "plan"
    defines = {} if spec == "plan" else _defines(spec)
    layer.MAX_LAYERS = defines.pop("MAX_LAYERS", _MOST)
    layer.SLOTS = defines.pop("SLOTS", _SLOTS)
    layer.SLOTS_LONG = defines.pop("SLOTS_LONG", _SLOTS_LONG)
    layer.EXTRA_DEFINES = defines
    model._plans.clear()


def depths(args) -> None:
    model, ids = _load(args.model, args.device, max(args.depths), args.new)
    for d in args.depths:
        row = []
        for spec in args.variant or [""]:
            _use(model, spec)
            runs = []
            for _ in range(args.runs):
                list(model.generate_ids(ids[:d], max_new_tokens=args.new, stop_ids=[]))
                runs.append(model.stats.decode_tps)
            row.append(f"[{spec}] {statistics.median(runs):.0f}")
        print(f"after {d} tokens, decode tok/s: " + "  ".join(row), flush=True)


def trace(args) -> None:
    layer.TRACE = True  # (before the model allocates its barrier buffer)
    model, ids = _load(args.model, args.device, max(args.depths), 4)
    groups = layer.resident_groups(model.device)
    launches = layer.launch_groups(model._builder.decoder_layers(),
                                   layer.max_layers(model.device))
    for d in args.depths:
        for spec in args.variant or [""]:
            if spec == "plan":
                print("(the per-layer plan meets no grid barriers: nothing to trace)")
                continue
            _use(model, spec)
            # a layer whose down projection runs inside the [gate | up] phase (layer.cl's
            # DFUSE) meets four grid barriers, not five: its phases read as A B C and D
            # (gate/up with down)
            fused = any(layer.fuses_down(model.device, ly.gate_up.parts[0][0], ly.down)
                        for ly in model.layers)
            names = "ABCD" if fused else PHASES
            per = len(names)
            list(model.generate_ids(ids[:d], max_new_tokens=4, stop_ids=[]))
            _, t = layer.read_trace(model.device, model._builder.bar, groups)
            work: dict[str, list[float]] = {p: [] for p in names}
            slow: dict[str, list[float]] = {p: [] for p in names}
            release: dict[str, list[float]] = {p: [] for p in names}
            wall: dict[str, list[float]] = {p: [] for p in names}
            each: dict[str, list[np.ndarray]] = {p: [] for p in names}
            spans: list[float] = []
            # the last step's barriers, launch by launch: per a layer but the last's
            at = len(t) - sum(per * len(g) - 1 for g in launches)
            for g in launches:
                n = per * len(g) - 1
                for k in range(1, n):  # (the phase before barrier k; A of the launch's first
                    b = at + k          # layer has no barrier before it)
                    p = names[k % per]
                    w = t[b, 0] - t[b - 1, 1]
                    work[p].append(float(np.median(w)))
                    each[p].append(w)
                    slow[p].append(float(w.max()))
                    release[p].append(float(np.median(t[b, 1]) - t[b, 0].max()))
                    wall[p].append(float(np.median(t[b, 1]) - np.median(t[b - 1, 1])))
                spans.append(float(np.median(t[at + n - 1, 1]) - np.median(t[at, 1])))
                at += n
            # inside attention: the last launch's units, from leaving the barrier before B
            last = launches[-1]
            pts = layer.read_attention_trace(model.device, model._builder.bar, groups, len(last))
            a0 = at - (per * len(last) - 1)
            inside: list[list[float]] = [[] for _ in range(layer.ATT_POINTS + 1)]
            for li in range(len(last)):
                leave, came = t[a0 + per * li, 1], t[a0 + per * li + 1, 0]
                unit = pts[li, -1] > leave
                for k in range(layer.ATT_POINTS):
                    inside[k] += (pts[li, k][unit] - leave[unit]).tolist()
                inside[-1] += (came[unit] - leave[unit]).tolist()
            cells = [f"{p} {statistics.median(work[p]) / 1e3:.1f}/"
                     f"{statistics.median(slow[p]) / 1e3:.1f}+"
                     f"{statistics.median(release[p]) / 1e3:.1f}" for p in names if work[p]]
            print(f"after {d} tokens [{spec}], us (median group / slowest group + release): "
                  + "  ".join(cells), flush=True)
            if args.groups:  # (each group's median over the layers)
                for p in names:
                    if not each[p]:
                        continue
                    per_group = np.median(np.stack(each[p]), axis=0) / 1e3
                    order = np.argsort(per_group)[::-1][:args.groups]
                    q = np.percentile(per_group, [0, 10, 50, 90, 100])
                    print(f"after {d} tokens [{spec}], phase {p}, us a group (min / p10 / "
                          f"median / p90 / max): {' / '.join(f'{v:.1f}' for v in q)}; slowest: "
                          + " ".join(f"{g}:{per_group[g]:.1f}" for g in order), flush=True)
            # (wall: between the median work-group's leaving the barriers before and after)
            print(f"after {d} tokens [{spec}], us of wall time a phase: "
                  + "  ".join(f"{p} {statistics.median(wall[p]) / 1e3:.1f}"
                              for p in names if wall[p])
                  + "; first to last barrier of a launch: "
                  + ", ".join(f"{v / 1e3:.0f}" for v in spans), flush=True)
            if inside[0]:
                points = ("inputs read", "tiles used", "warps' results", "stored", "arrived")
                print(f"after {d} tokens [{spec}], attention units, us after leaving the "
                      "barrier before B (median): " + ", ".join(
                          f"{nm} {statistics.median(v) / 1e3:.2f}"
                          for nm, v in zip(points, inside)), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("depths", "trace"):
        p = sub.add_parser(name)
        p.add_argument("model")
        p.add_argument("--device", default="gpu")
        p.add_argument("--depths", type=lambda s: [int(v) for v in s.split(",")],
                       default=[128, 1024, 4096, 16384])
        p.add_argument("--variant", action="append",
                       help="NAME=V;NAME=V defines, '' as it is, or plan (repeatable)")
        p.add_argument("--new", type=int, default=48)
        p.add_argument("--runs", type=int, default=3)
        p.add_argument("--groups", type=int, default=0,
                       help="trace: the N slowest work-groups of each phase, and percentiles")
    args = ap.parse_args(argv)
    {"depths": depths, "trace": trace}[args.cmd](args)


if __name__ == "__main__":
    main()
