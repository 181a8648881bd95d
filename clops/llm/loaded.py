"""llm, loaded: a model's weights on the device, as the typed views the step builder reads
(``Model.weights``; ``step.StepBuilder``), and what a batched engine needs of a model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..nn.quant import DeviceWeight
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .config import ModelConfig


@dataclass
class Projection:
    """A projection as one or more weights writing column ranges of one output of ``n``
    columns: (weight, its first output column, its bias or None) each (one part where the
    weights fuse into one matrix)."""

    parts: list[tuple[DeviceWeight, int, Buffer | None]]
    n: int


@dataclass(frozen=True)
class Experts:
    """A mixture of experts in place of a layer's FFN: the router ``[n, dim]`` and each
    projection's weights of every expert stacked, expert e's rows after the e experts before it
    (``gate`` and ``up`` ``[n * ffn, dim]``, ``down`` ``[n * dim, ffn]``); a token takes the
    ``k`` experts of its highest router scores, weighted by their softmax over every expert
    (renormalised over the k where ``norm``). Biases (gpt-oss) are per expert where given:
    ``router_bias`` [n], ``gate_bias`` and ``up_bias`` [n * ffn], ``down_bias`` [n * dim].
    Either ``gate_up`` is given, or ``gate`` and ``up``."""

    router: DeviceWeight
    gate: DeviceWeight | None
    up: DeviceWeight | None
    down: DeviceWeight
    n: int
    k: int
    ffn: int
    norm: bool
    router_bias: Buffer | None = None
    gate_bias: Buffer | None = None
    up_bias: Buffer | None = None
    down_bias: Buffer | None = None
    # (in place of gate and up, where they share a format: each expert's gate rows, then its up
    # rows, [n * 2 ffn, dim], and their biases alike: one product a layer instead of two)
    gate_up: DeviceWeight | None = None
    gate_up_bias: Buffer | None = None

    def products(self) -> list[DeviceWeight]:
        """The experts' weights: [gate | up] (or gate and up) and down."""
        return [w for w in (self.gate_up, self.gate, self.up, self.down) if w is not None]


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights on the device as the step builder reads them (``Model.weights``):
    norms the family does not have are None (norm weights hold the family's offset already:
    every norm is RMSNorm(x) * w); ``qkv`` writes rows [q | k | v], ``gate_up`` [gate | up].
    ``inv_freq``: the layer's rotary frequencies (rotary / 2 of them; zeros where it does not
    rotate, ``rotates`` False); ``window``: the positions a query attends to on this layer
    (0: all of them). A layer with ``experts`` has no ``gate_up`` and ``down``. ``o_bias``:
    the output projection's bias; ``sinks``: each head's attention sink (gpt-oss)."""

    attn_norm: Buffer | None
    qkv: Projection
    q_norm: Buffer | None
    k_norm: Buffer | None
    o: DeviceWeight
    post_attn_norm: Buffer | None
    ffn_norm: Buffer | None
    gate_up: Projection | None
    down: DeviceWeight | None
    post_ffn_norm: Buffer | None
    inv_freq: Buffer
    rotates: bool
    window: int
    experts: Experts | None = None
    o_bias: Buffer | None = None
    sinks: Buffer | None = None


@dataclass(frozen=True)
class ModelWeights:
    """A model's weights on the device: the token embedding, the final norm, the output
    projection (the embedding where they are tied) and the layers. (A part of a model split
    over devices holds the embedding if it is the first, the final norm and the output if it
    is the last: the others are None.)"""

    embed: DeviceWeight | None
    out_norm: Buffer | None
    output: DeviceWeight | None
    layers: tuple[LayerWeights, ...]


class LoadedModel(Protocol):
    """What ``BatchEngine`` reads of a model (``Model`` is one): its config, device, context
    (``max_seq``), cache type (``kv_half``: float16 values) and weights."""

    config: ModelConfig
    device: CLDevice
    max_seq: int
    kv_half: bool

    @property
    def stages(self) -> Sequence[Any]:
        """Where its layers are (``placement.Stage``s: several for a model split over devices,
        whose ``device`` is the last one's)."""

    @property
    def weights(self) -> ModelWeights: ...
