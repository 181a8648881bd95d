"""decode_layers (kernels/layer.cl): a decode row's decoder layers in one launch of
work-groups that all run at once and meet at grid barriers, against the per-layer plan it
replaces (the same int8 rows), at one chunk of positions and at several (the last work-group
of a head combining the chunks). Runs where the grid-barrier probe passes (NVIDIA GPUs); CPU
runtimes promise no concurrent work-groups and are not asked."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.kernels import layer

from ..fuzz.tiny_files import TinyShape, write_gguf

# every layer matrix 4- or 8-bit (what decode_layers takes: half scales, and Q4_K's float
# ones; and float16); heads of 64
SHAPE = TinyShape(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                  embed_type="Q8_0", output_type="Q8_0", context=1024,
                  layer_types=(("Q4_0", "Q8_0", "Q4_1", "Q8_0"),
                               ("Q4_K", "Q4_1", "Q8_0", "Q4_K")))


# three layers of the same formats: one launch of three (a grid barrier between layers)
SAME = TinyShape(dim=256, layers=3, heads=4, kv_heads=2, head_dim=64, ffn=512,
                 embed_type="Q8_0", output_type="Q8_0", context=1024,
                 layer_types=(("Q4_0", "Q8_0", "Q4_K", "Q8_0"),))


@pytest.fixture(scope="module")
def model_file(files) -> str:
    return files["mixed"]


# not taken (the per-layer plan serves): heads of 256; four query heads of 128 a key-value head
# (layer.MAX_REP_DIMS); an FFN past layer.MAX_FFN
WIDE = TinyShape(dim=512, layers=2, heads=2, kv_heads=1, head_dim=256, ffn=512,
                 embed_type="Q8_0", output_type="Q8_0", context=1024,
                 layer_types=(("Q8_0", "Q4_0", "Q4_1", "Q8_0"),))
REP4 = TinyShape(dim=512, layers=1, heads=4, kv_heads=1, head_dim=128, ffn=512,
                 embed_type="Q8_0", output_type="Q8_0", context=1024, rope_freqs=False,
                 layer_types=(("Q8_0", "Q8_0", "Q8_0", "Q8_0"),))
BROAD = TinyShape(dim=256, layers=1, heads=4, kv_heads=2, head_dim=64, ffn=8448,
                  embed_type="Q8_0", output_type="Q8_0", context=1024,
                  layer_types=(("Q8_0", "Q8_0", "Q8_0", "Q8_0"),))
REFUSED = {"wide": WIDE, "rep4": REP4, "broad": BROAD}
# float16 layers, and one whose phases mix float16 and 4- and 8-bit weights; an FFN of 4608: on
# NVIDIA the pipelined down phase takes a row in two parts, the second mostly past the row, and
# the [gate | up] phase several pairs a warp; a float16 embedding, read by the first layer launch
# (no embedding launch)
F16 = TinyShape(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=4608,
                embed_type="F16", output_type="Q8_0", context=1024,
                layer_types=(("F16", "F16", "F16", "F16"), ("F16", "Q8_0", "Q4_0", "F16")))
# ten layers of the same formats: one launch where the device's arguments hold them (16 layers
# at most), else two; float16 (ten layers of int8 inputs drift past the bounds below)
DEEP = TinyShape(dim=128, layers=10, heads=4, kv_heads=2, head_dim=32, ffn=256,
                 embed_type="F16", output_type="Q8_0", context=1024,
                 layer_types=(("F16", "F16", "F16", "F16"),))
# Qwen3's: heads of 128, q and k RMS-normed a head before the rotation (QK-norm), two query
# heads a key-value head, 8-bit layers and a float16 embedding
QK = TinyShape(dim=256, layers=2, heads=2, kv_heads=1, head_dim=128, ffn=512,
               embed_type="F16", output_type="Q8_0", context=1024, rope_freqs=False,
               qk_norm=True, layer_types=(("Q8_0", "Q8_0", "Q8_0", "Q8_0"),))
SHAPES = {"mixed": SHAPE, "same": SAME, "f16": F16, "deep": DEEP, "qk": QK}

# float16 rows of 1024 packed into 16 work-groups of output rows: of an FFN of 2016, an H100's
# 132 work-groups take 1056 pairs a round, and the 960 after it go to the 116 early loaders (928)
# and, spread over their warps, to the output phase's (GU_DEAL)
SPREAD = TinyShape(dim=1024, layers=1, heads=16, kv_heads=4, head_dim=64, ffn=2016,
                   embed_type="F16", output_type="Q8_0", context=1024,
                   layer_types=(("F16", "F16", "F16", "F16"),))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("layer")
    return {k: write_gguf(str(d / f"{k}.gguf"), arch="qwen3" if v.qk_norm else "llama",
                          shape=v)
            for k, v in {**SHAPES, **REFUSED, "spread": SPREAD}.items()}


def _both(device, monkeypatch, path: str, prompt: int, splits: int | None,
          kv_cache: str | None = None):
    """The model at ``path`` through the layer kernel (attention's splits of a key-value
    head's positions at most ``splits``) and a prompt of ``prompt`` tokens; the decode step's
    logits of the per-layer plan and of it."""
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    monkeypatch.setattr(layer, "SPLITS", splits)
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False,
                           kv_cache=kv_cache)
    assert model._builder.whole_layers()
    ids = np.random.default_rng(prompt).integers(0, model.config.vocab_size, prompt).tolist()
    return model, ids, _step_logits(model, ids, False), _step_logits(model, ids, True)


def _groups(model) -> list[list[layer.DecoderLayer]]:
    """The decode step's launches of layers."""
    layers = model._builder.decoder_layers()
    return layer.launch_groups(layers, layer.max_layers(model.device,
                                                         layers[0].q_norm is not None))


def _barriers(model) -> int:
    """Grid barriers a decode step meets: four a layer and one between layers of a launch."""
    groups = _groups(model)
    return sum(5 * len(g) - 1 for g in groups)


def _embedding_read_by_the_layers(model, folded: bool) -> None:
    """The decode step's launches: a float16 embedding read by the first layer launch (no
    embedding launch), any other by an embedding launch."""
    names = [ln.name for ln in model._plan(1, "last", True, model._decode_span(1)).launches]
    assert ("embedding" in names) != folded, names
    assert names.index("decode_layers") == (0 if folded else 1), names


def _step_logits(model, ids: list[int], whole: bool) -> np.ndarray:
    """The logits of the decode step after ``ids`` (the prompt's token, then one step)."""
    model._builder.whole = whole
    model._plans.clear()
    list(model.generate_ids(ids, max_new_tokens=2, stop_ids=[]))
    out = np.empty(model.config.vocab_size, np.float32)
    model.device.read(out, model.logits_buf, blocking=True)
    return out


@pytest.mark.parametrize("splits, kv_cache", [(None, None), (1, None), (3, None),
                                              (None, "float32"), (1, "float32")])
@pytest.mark.parametrize("prompt", [40, 300, 700, 1000])
@pytest.mark.parametrize("which", list(SHAPES))
def test_layer_kernel_matches_the_per_layer_plan(device, monkeypatch, files, which, prompt,
                                                  splits, kv_cache):
    # (kv_cache None: the GPU's float16 cache; splits None: as many as the work-groups allow,
    # 1: a work-group's warps take every tile of a key-value head, four rounds of them at 1000
    # positions)
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    model, ids, want, got = _both(device, monkeypatch, files[which], prompt, splits, kv_cache)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()
    _embedding_read_by_the_layers(model, which in ("f16", "deep", "qk"))
    bar = np.empty(4, np.int32)
    device.read(bar, model._builder.bar, blocking=True)
    # every barrier met, none timed out
    assert layer.arrivals(bar) % layer.resident_groups(device) == 0 and bar[2] == 0, bar
    # and a generation through it: the same greedy tokens as the per-layer plan's, the first
    # of them at least (random weights: later near-ties may part them)
    model._builder.whole, model._plans = True, {}
    toks = list(model.generate_ids(ids, max_new_tokens=6, stop_ids=[]))
    model._builder.whole, model._plans = False, {}
    assert list(model.generate_ids(ids, max_new_tokens=6, stop_ids=[]))[:2] == toks[:2]


@pytest.mark.parametrize("prompt", [40, 700])
@pytest.mark.parametrize("which", ["f16", "mixed", "spread", "deep"])
def test_layer_kernel_packed_output_rows(device, monkeypatch, files, which, prompt):
    """The output rows packed into as few work-groups as the registers allow (on NVIDIA from
    8 MB of [gate | up] weights a layer; here from any): the others load their first [gate |
    up] weights while attention runs, and the pairs past the full rounds are dealt to them
    first, then to the output phase's (GU_DEAL: an H100's 132 work-groups take f16's 4608
    pairs in four rounds and 384 more; SPREAD; deep's 256 pairs are fewer than a round, dealt
    by place, so that some go to work-groups past the first 32, which a round in the groups'
    order would give none). Against the per-layer plan."""
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    monkeypatch.setattr(layer, "PACK_MIN_BYTES", 0)
    _, _, want, got = _both(device, monkeypatch, files[which], prompt, None)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


# each shape with two of the four choices of splits and cache, each choice with two shapes
# (every pair a build of the layer kernel of its own: about 8 s on Intel's runtime)
PORTABLE = [("mixed", None, "float32"), ("mixed", 1, "float16"), ("same", 3, "float32"),
            ("same", 3, "float16"), ("f16", None, "float32"), ("f16", 3, "float16"),
            ("deep", 3, "float32"), ("deep", 1, "float16"), ("qk", 3, "float16")]


@pytest.mark.parametrize("prompt", [40, 700])
@pytest.mark.parametrize("which, splits, kv_cache", PORTABLE)
def test_layer_kernel_one_group_portable(device, monkeypatch, files, which, prompt,
                                         splits, kv_cache):
    """The kernel's portable code (no PTX) run as one work-group, whose grid barriers are met
    at once: every phase, the task rounds, the rotation, splits and their combine, against the
    per-layer plan on the same device (row-major weights). CPUs only: they never take the kernel
    otherwise; Intel's runtime builds it in seconds, PoCL's took 320 s (not run there)."""
    if device.kind != "cpu" or "intel" not in device.platform_name.lower():
        pytest.skip(f"{device.name} on {device.platform_name}: the portable one-group run is "
                    "for Intel's CPU runtime (GPUs run the kernel itself above)")
    from clops.nn import quant
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(layer, "resident_groups", lambda dev: 1)
    model, ids, want, got = _both(device, monkeypatch, files[which], prompt, splits, kv_cache)
    # (the plan's CPU products take float inputs, the kernel int8: 2.4-3.5% of the largest
    # logit apart here; a wrong head, rotation or split is off by the logits' scale)
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert np.argmax(got) == np.argmax(want)
    bar = np.empty(4, np.int32)
    device.read(bar, model._builder.bar, blocking=True)
    groups = _groups(model)
    most = layer.max_layers(device)
    assert [len(g) for g in groups] == {"mixed": [1, 1], "same": [3], "f16": [1, 1],
                                        "deep": [10] if most >= 10 else [most, 10 - most],
                                        "qk": [2]}[which]
    # one decode step through the kernel: every grid barrier met
    assert layer.arrivals(bar) == _barriers(model) and bar[2] == 0, bar
    _embedding_read_by_the_layers(model, which in ("f16", "deep", "qk"))


def test_launch_groups():
    """Layers of the same formats share a launch, as many as the device's arguments hold."""
    def one(fmt: str) -> layer.DecoderLayer:
        w = type("W", (), {"fmt": fmt, "defines": {"SCALE_HALF": 1}})()
        return layer.DecoderLayer(None, w, None, None, None, w, None, w, w)  # type: ignore

    layers = [one("q4")] * 19 + [one("q8")] * 2 + [one("q4")]
    assert [len(g) for g in layer.launch_groups(layers, 8)] == [8, 8, 3, 2, 1]
    assert [len(g) for g in layer.launch_groups(layers, 16)] == [16, 3, 2, 1]

    def dev(nbytes: int):
        return type("D", (), {"caps": type("C", (), {"max_parameter_size": nbytes})()})()

    # 1024 bytes (every device): 8 layers' 13 pointers and the 11 shared arguments (with EMB's
    # and PAGED's three each) fit
    assert layer.max_layers(dev(1024)) == 8  # type: ignore[arg-type]
    assert 116 + 8 * 104 <= 1024 < 116 + 9 * 104
    # and 7 with QK-norm's two weights a layer more
    assert layer.max_layers(dev(1024), qk_norm=True) == 7  # type: ignore[arg-type]
    assert 116 + 7 * 120 <= 1024 < 116 + 8 * 120
    assert layer.max_layers(dev(4352)) == layer.MAX_LAYERS == 16  # type: ignore[arg-type]


def test_units_count_attention_work_groups(monkeypatch):
    """Attention's units as layer.cl's split_len makes them: one a key-value head up to 256
    positions, then splits of 64 positions at least, SPLITS_MAX at most, rounded to tiles of
    32 (the output rows' packing is chosen from them)."""
    monkeypatch.setattr(layer, "splits_max", lambda dev, n_kv: 16)
    assert layer.units(None, 8, 256) == 8  # type: ignore[arg-type]
    assert layer.units(None, 8, 257) == 8 * 5  # 5 splits of 64 positions (the last of 1)
    assert layer.units(None, 8, 512) == 8 * 8
    assert layer.units(None, 8, 4097) == 8 * 15  # 16 splits of 257 -> 288 positions: 15
    assert layer.units(None, 2, 16384) == 2 * 16


@pytest.mark.parametrize("which", list(REFUSED))
def test_layer_kernel_refuses_what_it_does_not_serve(device, monkeypatch, files, which):
    # (even where the grid barriers would hold and the weights are row-major, so that only
    # the shapes refuse): the per-layer plan decodes
    from clops.nn import quant
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    monkeypatch.setattr(layer, "resident_groups", lambda dev: 1)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    model = clops.llm.load(files[which], device=device, max_seq_len=256, progress=False)
    assert not model._builder.whole_layers()
    assert list(model.generate_ids([1, 2, 3], max_new_tokens=3, stop_ids=[]))


@pytest.mark.parametrize("setting", [None, "0", "1"])
def test_layer_kernel_takes_float16_weights_unless_turned_off(device, monkeypatch, files,
                                                              setting):
    from clops.nn import quant
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    if setting is None:
        monkeypatch.delenv("CLOPS_LAYER_KERNEL_F16", raising=False)
    else:
        monkeypatch.setenv("CLOPS_LAYER_KERNEL_F16", setting)
    asked = setting != "0"
    monkeypatch.setattr(layer, "resident_groups", lambda dev: 1)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    model = clops.llm.load(files["f16"], device=device, max_seq_len=256, progress=False)
    assert model._builder.whole_layers() == asked
    model = clops.llm.load(files["mixed"], device=device, max_seq_len=256, progress=False)
    assert model._builder.whole_layers()


def test_layer_kernel_turned_off(device, monkeypatch, model_file):
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "0")
    model = clops.llm.load(model_file, device=device, max_seq_len=256, progress=False)
    assert not model._builder.whole_layers()


def test_layer_kernel_on_by_default(device, monkeypatch, model_file):
    monkeypatch.delenv("CLOPS_LAYER_KERNEL", raising=False)
    model = clops.llm.load(model_file, device=device, max_seq_len=256, progress=False)
    assert model._builder.whole_layers() == bool(layer.resident_groups(device))


def test_layer_kernel_asked_for_runs_only_with_grid_barriers(device, monkeypatch, model_file):
    # CPU runtimes (and GPUs whose probe fails) keep the per-layer plan when it is asked for
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    model = clops.llm.load(model_file, device=device, max_seq_len=256, progress=False)
    assert model._builder.whole_layers() == bool(layer.resident_groups(device))
    assert list(model.generate_ids([1, 2, 3], max_new_tokens=3, stop_ids=[]))


def test_layer_kernel_trace(device, monkeypatch, files):
    """With TRACE on, every work-group's clock at each grid barrier of a decode step comes back
    in order: it arrives, then leaves, then arrives at the next (NVIDIA: the GPU's timer)."""
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    monkeypatch.setattr(layer, "TRACE", True)
    model = clops.llm.load(files["same"], device=device, max_seq_len=1024, progress=False)
    assert model._builder.whole_layers()
    assert model._builder.bar.nbytes >= layer.bar_nbytes(True)
    list(model.generate_ids([1, 2, 3], max_new_tokens=3, stop_ids=[]))
    groups = layer.resident_groups(device)
    met, times = layer.read_trace(device, model._builder.bar, groups)
    assert met % _barriers(model) == 0 and met >= _barriers(model)
    step = times[-_barriers(model):]  # the last step's barriers, [barrier, arrive/leave, group]
    assert step.shape == (_barriers(model), 2, groups)
    assert (step > 0).all()
    seq = step.transpose(2, 0, 1).reshape(groups, -1)  # each group's times in order
    assert (np.diff(seq, axis=1) >= 0).all()
    # a barrier is left only after the last group arrived
    assert (step[:, 1, :].min(axis=1) >= step[:, 0, :].max(axis=1)).all()


def test_extra_defines_may_not_set_what_the_launch_computes(device, monkeypatch, files):
    """Measurement's EXTRA_DEFINES cannot resize the kernel: a size it names is refused, and
    the step raises before anything is built or launched."""
    from clops.nn import quant
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    monkeypatch.setattr(layer, "resident_groups", lambda dev: 1)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(layer, "EXTRA_DEFINES", {"SPLIT_MIN": 16, "PHASES": 31})
    model = clops.llm.load(files["same"], device=device, max_seq_len=256, progress=False)
    assert model._builder.whole_layers()
    with pytest.raises(ValueError, match=r"may not set \['SPLIT_MIN'\]"):
        list(model.generate_ids([1, 2, 3], max_new_tokens=2, stop_ids=[]))


# float16 rows of 2048, whose [gate | up] pairs take two parts of a register stage where the span
# is long (8 slots: prompts of 700 tokens here); written only where the test runs (46 MB)
WIDE2048 = TinyShape(dim=2048, layers=1, heads=32, kv_heads=8, head_dim=64, ffn=2048,
                     embed_type="F16", output_type="Q8_0", context=1024,
                     layer_types=(("F16", "F16", "F16", "F16"),))


@pytest.mark.parametrize("prompt", [40, 700])
@pytest.mark.parametrize("which", ["f16", "spread", "deep", "wide2048"])
def test_fused_down_projection_matches_the_phases_apart(device, monkeypatch, files, which,
                                                        prompt, tmp_path):
    """NVIDIA: the float16 layers' down projection inside the [gate | up] phase (DFUSE: the
    down weights' columns, atomic additions into x) against the kernel with the phases apart,
    and the layers it serves hold the columns' copy. (The phases apart round the GLU's values
    to float16 for the tensor cores, the fused phase keeps them float32: 0.4-0.5% of the
    largest logit apart here, over ten layers of random weights.)"""
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    path = write_gguf(str(tmp_path / "w.gguf"), shape=WIDE2048) if which == "wide2048" \
        else files[which]
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False)
    assert model._builder.whole_layers()
    ids = np.random.default_rng(prompt).integers(0, model.config.vocab_size, prompt).tolist()
    logits = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("CLOPS_FUSE_DOWN", fused)
        logits[fused] = _step_logits(model, ids, True)
    fuses = [layer.fuses_down(device, ly.gate_up.parts[0][0], ly.down) for ly in model.layers]
    # (f16's second layer mixes formats: it keeps the phases apart)
    assert fuses == {"f16": [True, False], "spread": [True], "deep": [True] * 10,
                     "wide2048": [True]}[which]
    assert all((model._builder.down_cols.get(j) is not None) == f
               for j, f in enumerate(fuses))
    want, got = logits["0"], logits["1"]
    assert np.abs(got - want).max() <= 0.015 * np.abs(want).max()


@pytest.mark.parametrize("prompt, short", [(40, True), (700, False)])
def test_short_spans_build_the_fused_kernel_as_measured(device, monkeypatch, files, prompt,
                                                       short):
    """NVIDIA, the float16 layers' kernel (DFUSE): where the decode plan's span is shorter than
    SLOTS_LONG_FROM it is built with layer.SHORT_FUSED's defines (attention's score loop
    unrolled twice, the [gate | up] phase's last pairs dealt otherwise), elsewhere with the
    kernel's own; the logits are those of the kernel's own defines."""
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    model = clops.llm.load(files["spread"], device=device, max_seq_len=1024, progress=False)
    assert model._builder.whole_layers()
    built: list[dict] = []
    real = layer.kernel

    def spy(*args, **defines):
        built.append(defines)
        return real(*args, **defines)

    def layer_builds() -> set[tuple]:  # (decode_layers' builds: DFUSE and SHORT_FUSED's keys)
        return {(d["DFUSE"],) + tuple(d.get(k) for k in layer.SHORT_FUSED)
                for d in built if "DFUSE" in d}

    monkeypatch.setattr(layer, "kernel", spy)
    ids = np.random.default_rng(prompt).integers(0, model.config.vocab_size, prompt).tolist()
    got = _step_logits(model, ids, True)
    assert layer_builds() == {(1,) + (tuple(layer.SHORT_FUSED.values()) if short
                                      else (None,) * len(layer.SHORT_FUSED))}
    built.clear()
    monkeypatch.setattr(layer, "SHORT_FUSED", {})
    want = _step_logits(model, ids, True)
    assert layer_builds() == {(1,)}
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


def test_down_columns_are_the_weights_transposed(device):
    """layer.down_columns: the float16 down weights' columns as rows, on the device."""
    from types import SimpleNamespace

    rows = np.random.default_rng(0).standard_normal((48, 80)).astype(np.float16)
    buf = device.alloc(rows.nbytes)
    device.write(buf, rows, blocking=True)
    cols = layer.down_columns(device, SimpleNamespace(n=48, k=80, data=buf))  # type: ignore
    got = np.empty((80, 48), np.float16)
    device.read(got, cols, blocking=True)
    assert np.array_equal(got, rows.T)


def test_fused_down_projection_turned_off(device, monkeypatch):
    """CLOPS_FUSE_DOWN=0 keeps the phases apart, as CPUs (no PTX) always do."""
    from types import SimpleNamespace

    w = SimpleNamespace(fmt="f16", layout="rows", n=2048, k=8192)
    # (without NVIDIA's PTX: never)
    assert layer.fuses_down(device, w, w) == bool(layer._ptx(device))  # type: ignore[arg-type]
    monkeypatch.setattr(layer, "_ptx", lambda dev: 1)
    assert layer.fuses_down(device, w, w)  # type: ignore[arg-type]
    assert not layer.fuses_down(device, w, SimpleNamespace(**{**vars(w), "n": 4096}))  # type: ignore
    monkeypatch.setenv("CLOPS_FUSE_DOWN", "0")
    assert not layer.fuses_down(device, w, w)  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction, kept", [(0.0, False), (1.0, True)])
def test_down_columns_kept_within_the_copies_memory(device, monkeypatch, files, fraction, kept):
    """The fused layers' column copies are made only where they take at most the fraction of
    the device's memory that float16 copies may (HALF_COPIES_FRACTION); else the phases stay
    apart."""
    from clops.llm import model as model_mod

    monkeypatch.setattr(layer, "fuses_down", lambda dev, gu, down: True)
    monkeypatch.setattr(model_mod, "HALF_COPIES_FRACTION", fraction)
    model = clops.llm.load(files["deep"], device=device, max_seq_len=256, progress=False)
    dl = model._builder.decoder_layer(0)
    assert (dl.down_cols is not None) == kept
