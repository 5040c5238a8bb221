"""Load Llama-family checkpoints (Hugging Face layout): a local directory, a Hugging Face Hub
model (`org/name[@revision]`, `hf://...`) or an object-store URI (fetched to the cache first)."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.config import DRAFT_WEIGHTS
from engine.errors import ModelLoadError
from engine.families import Family, SpeechLayout, resolve
from engine.hf import from_transformers
from engine.io.storage import model_dir
from engine.models.device import resolve_compile, resolve_dtype
from engine.models.llama import LlamaLM, LlamaShape
from engine.models.packed import prepack_supported
from engine.models.quant import cpu_vnni

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
DRAFT_INFO = "pcg_draft.json"  # how a draft was made (engine/draft): no part of its tokenizer
# a checkpoint's config, weight index and records: what a draft does not copy from its source
NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
              "README.md", ".gitattributes", "training.json", "train_log.jsonl"}
NOT_TOKENIZER = NOT_COPIED | {"generation_config.json", DRAFT_INFO}  # files no tokenizer reads
TOKENIZERS_KEPT = 4

HOW_TO_GET = (
    "Build the tiny kit with `pcg-synth kit build DIR`, pass a Hugging Face model id such as "
    "HKUSTAudio/Llasa-1B or canopylabs/orpheus-3b-0.1-ft (fetched into the Hugging Face cache), or a local copy of one "
    "(config.json, *.safetensors, tokenizer files)."
)


@dataclass
class LoadedModel:
    """A model ready for decoding, with the tokenizer, family and layout it was checked against."""

    path: Path
    model: LlamaLM
    tokenizer: object
    layout: SpeechLayout
    config: dict
    family: Family


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft must share the target's vocabulary (same ids for the same tokens)."""
    if draft.layout != target.layout:
        raise ValueError(
            f"draft {draft.path} and target {target.path} lay out speech tokens differently "
            f"({draft.layout} vs {target.layout}): a draft must share the target's vocabulary")
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError(f"draft {draft.path} and target {target.path} have different tokenizer "
                         "vocabularies: a draft must share the target's vocabulary")


def read_config(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist. {HOW_TO_GET}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json. {HOW_TO_GET}")
    config = json.loads(cfg_file.read_text())
    if config.get("model_type") != "llama":
        raise ModelLoadError(
            f"{path} holds model_type {config.get('model_type')!r}; pcg-synth serves Llama "
            "causal LMs (Llasa and Orpheus are)"
        )
    return config


ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings"}


def rope_parameters(config: dict) -> dict | None:
    """A config's rotary settings where they are of a kind `own_rope_tables` computes: `default`
    or `llama3` (Llasa's and Orpheus's), in transformers 5's layout (`rope_parameters`) or 4's (`rope_theta`
    beside `rope_scaling`), with every key known. None for anything else."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
        if "rope_theta" in config:
            params.setdefault("rope_theta", config["rope_theta"])
    if not isinstance(params, dict) or "rope_theta" not in params or set(params) - ROPE_KEYS:
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    return {**params, "rope_type": kind} if kind in ("default", "llama3") else None


def own_rope_tables(config: dict) -> tuple[torch.Tensor, float] | None:
    """Rotary inverse frequencies and cos/sin scaling for `rope_parameters`' kinds, computed as
    transformers computes them (`tests/cpu/test_llama_parity.py` compares them bit for bit)
    without importing transformers' Llama model, a large share of a fresh process's start-up.
    None where `rope_parameters` is None."""
    params = rope_parameters(config)
    if params is None:
        return None
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = params["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if params["rope_type"] == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_context = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq, 1.0


def rope_tables(config: dict) -> tuple[torch.Tensor, float]:
    """Rotary inverse frequencies and cos/sin scaling exactly as transformers computes them:
    `own_rope_tables` where it applies, transformers' own Llama rotary embedding otherwise."""
    own = own_rope_tables(config)
    if own is not None:
        return own
    rotary_class = from_transformers("LlamaRotaryEmbedding", "transformers.models.llama.modeling_llama")
    rotary = rotary_class(from_transformers("LlamaConfig")(**config))
    return rotary.inv_freq.detach().clone(), float(rotary.attention_scaling)


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights. {HOW_TO_GET}")
    return files


def load_weights(model: LlamaLM, path: Path, device: torch.device) -> None:
    """Copy checkpoint tensors into `model`; the head keeps only the output rows."""
    wanted = {k: v for k, v in model.state_dict().items() if k != "head"}
    head_source = "model.embed_tokens.weight" if model.shape.tie_word_embeddings else "lm_head.weight"
    seen: set[str] = set()
    rows = model.output_token_ids.cpu()
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                if key == head_source:
                    model.head.data.copy_(f.get_tensor(key)[rows].to(model.dtype))
                    seen.add("head")
                if key in wanted:
                    wanted[key].copy_(f.get_tensor(key).to(model.dtype))
                    seen.add(key)
                elif key != "lm_head.weight":
                    raise ModelLoadError(f"{path}: unexpected tensor {key!r} for a Llama model")
    missing = sorted(set(wanted) - seen) + ([] if "head" in seen else [head_source])
    if missing:
        raise ModelLoadError(f"{path}: checkpoint lacks {missing[:4]} ({len(missing)} tensors)")


def check_weights(weights: str, compile: str) -> None:
    """A known weight format, and int8 only with an eager step (call before loading anything)."""
    if weights not in DRAFT_WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(DRAFT_WEIGHTS)}, not {weights!r}")
    if weights == "int8" and compile not in ("none", "auto"):
        raise ValueError("int8 weights run eagerly: use compile none (or auto) with them")


def ready_for_decoding(model: LlamaLM, prepack: bool | None = None, compile: str = "none",
                       weights: str = "native", fuse: bool = True) -> LlamaLM:
    """Inference mode, projections fused (`LlamaLM.fuse_projections`, unless `fuse` is False),
    weights prepacked for oneDNN where that is supported (`prepack` None: automatically, unless
    rounds are compiled; see `PackedLinear` for why and what it bought), and the compile mode of
    its decode rounds set (`LlamaLM.set_compile_mode`; `auto` resolved by `resolve_compile`).
    `weights` `int8` stores projections and head in int8 instead (`Int8Linear`, CPU, eager)."""
    model.eval().requires_grad_(False)
    check_weights(weights, compile)
    compile = resolve_compile(compile, model.device, weights)
    if fuse:
        model.fuse_projections()
    if weights == "int8":
        if not cpu_vnni():
            warnings.warn("int8 weights on a CPU without VNNI/AMX int8 instructions (e.g. AVX2 only) run "
                          "slower than native ones in oneDNN; draft_weights native is faster here", stacklevel=2)
        model.quantize_int8()
        return model
    if prepack is None:
        prepack = prepack_supported(model.device, model.dtype)
    if prepack:
        model.prepack()
    model.set_compile_mode(compile)
    return model


_TOKENIZERS: OrderedDict[str, object] = OrderedDict()  # tokenizer_digest -> tokenizer
_TOKENIZERS_LOCK = threading.Lock()


def tokenizer_digest(path: Path) -> str:
    """SHA-256 of what a checkpoint's tokenizer is made from: every file but weights, configs and
    training records, and the two config fields that pick a tokenizer class."""
    path = Path(path)
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name not in NOT_TOKENIZER and not f.name.endswith(WEIGHT_SUFFIXES):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    digest.update(json.dumps([config.get("model_type"), config.get("tokenizer_class")]).encode())
    return digest.hexdigest()


def added_tokens_in_backend(path: Path) -> bool:
    """Whether `tokenizer.json` already holds every added token the other tokenizer files name,
    with the same flags, so that transformers need not rebuild them from the config.

    transformers turns a config's `added_tokens_decoder` (or, without one, `tokenizer.json`'s
    added tokens) into Python objects and deep-copies them, which is most of a Llasa tokenizer's
    load (65,549 added tokens). Where this holds, loading with an empty `added_tokens_decoder`
    gives the same tokenizer (vocabulary, added and special tokens, encodings, chat template,
    saved files: `tests/cpu/test_tokenizer_load.py`). Files only transformers' legacy path reads
    (`added_tokens.json`, or `special_tokens_map.json` beside a config without
    `added_tokens_decoder`) mean no."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file() or (path / "added_tokens.json").exists():
        return False
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    listed = config.get("added_tokens_decoder")
    if listed is None:
        return not (path / "special_tokens_map.json").exists()
    backend = json.loads((path / "tokenizer.json").read_text()).get("added_tokens", [])
    # both hold the same six fields per token (content, flags); any other difference means no
    return listed == {str(token.pop("id", None)): token for token in backend}


BACKEND_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")  # names of transformers' tokenizers-backed class


def backend_class_named(path: Path) -> bool:
    """Whether transformers' `AutoTokenizer` builds this checkpoint's tokenizer as its generic
    tokenizers-backed class (`TokenizersBackend`): `tokenizer_config.json` names that class
    (Llasa's does), without custom code, for a Llama checkpoint or tokenizer files alone (model
    types for which transformers registers no tokenizer class of its own). Then `load_tokenizer`
    builds that class directly, without `AutoTokenizer`'s reading of the model config, which
    imports most of transformers' model code.
    `tests/cpu/test_tokenizer_load.py` checks that both give the same tokenizer,
    of the same class, with the transformers installed."""
    path = Path(path)
    config_file, tokenizer_file = path / "config.json", path / "tokenizer_config.json"
    if not tokenizer_file.is_file():
        return False
    tokenizer_config = json.loads(tokenizer_file.read_text())
    model_type = json.loads(config_file.read_text()).get("model_type") if config_file.is_file() else None
    return (tokenizer_config.get("tokenizer_class") in BACKEND_CLASSES and "auto_map" not in tokenizer_config
            and model_type in ("llama", None))


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, shared by every load of identical tokenizer files in this
    process (a target and its draft; every model a process loads again), built without
    transformers' copies of the added tokens where `added_tokens_in_backend` (about half the
    load time), and as `TokenizersBackend` directly where `backend_class_named` (which spares
    most of those imports).
    The engine only reads it (encodes without truncation or padding, so concurrent use never
    changes its settings); callers must not modify it."""
    try:
        key = tokenizer_digest(path)
        with _TOKENIZERS_LOCK:
            if key not in _TOKENIZERS:
                loader = from_transformers("TokenizersBackend" if backend_class_named(path) else "AutoTokenizer")
                fast = {"added_tokens_decoder": {}} if added_tokens_in_backend(path) else {}
                _TOKENIZERS[key] = loader.from_pretrained(str(path), **fast)
                while len(_TOKENIZERS) > TOKENIZERS_KEPT:
                    _TOKENIZERS.popitem(last=False)
            _TOKENIZERS.move_to_end(key)
            return _TOKENIZERS[key]
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load its tokenizer ({exc}). {HOW_TO_GET}") from exc


def empty_model(config: dict, layout: SpeechLayout, device: torch.device, dtype: torch.dtype) -> LlamaLM:
    """The config's `LlamaLM` on `device` in `dtype`, its weights not yet set (built on the meta
    device; the output ids are made before, as ops on meta tensors import torch's compiler stack,
    which a fresh process would otherwise pay for)."""
    ids = layout.output_token_ids()
    inv_freq, scaling = rope_tables(config)
    with torch.device("meta"):
        model = LlamaLM(LlamaShape.from_config(config), ids, inv_freq, scaling)
    # what `model.to_empty(device=device).to(dtype)` does, with factory calls only: `to_empty`'s
    # `empty_like` of meta tensors runs torch's Python reference ops, which import sympy
    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, t in tensors.items():
                if t is not None:
                    new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)
                    tensors[name] = nn.Parameter(new, t.requires_grad) if isinstance(t, nn.Parameter) else new
    model.output_token_ids = ids.to(device)
    model.set_rope_tables(inv_freq.to(device))
    return model


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    tokenizer=None,
    prepack: bool | None = None,
    compile: str = "none",
    weights: str = "native",
    fuse: bool = True,
    family: str = "auto",
) -> LoadedModel:
    """Load a speech LM (a Llama of a known family) from a local directory, its head restricted
    to the family's output space (codes + end-of-speech).

    Args:
        path: directory with `config.json`, safetensors weights and (unless `tokenizer` is
            given) tokenizer files; or a Hub model id or object-store URI of one (`model_dir`).
        device: where the weights go.
        dtype: `auto`, `float32`, `bfloat16`, `float16` or `float64`.
        tokenizer: reuse this tokenizer instead of loading the directory's own.
        prepack: store the projections in oneDNN's layout (None: on CPU where supported).
        compile: `auto`, `none`, `inductor` or `cudagraphs` (`ready_for_decoding`).
        weights: `native` (the dtype's weights) or `int8` (`Int8Linear`; a draft on CPU).
        fuse: fuse each layer's q/k/v and gate/up projections (`LlamaLM.fuse_projections`).
        family: `auto` (detected from the tokenizer) or a family's name (checked against it).

    Raises:
        ModelLoadError: missing/incomplete directory, not a Llama model.
        UnknownFamily: the tokenizer is of no known family, or not of `family`.
        ValueError: the tokenizer lacks a token its family needs.
        StorageError: a Hub model or URI that cannot be fetched.
    """
    path = model_dir(path)
    config = read_config(path)
    device = torch.device(device)
    dtype = resolve_dtype(dtype, device)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    found = resolve(tokenizer, family, str(path))
    layout = found.layout(tokenizer, model_vocab_size=config["vocab_size"])
    model = empty_model(config, layout, device, dtype)
    load_weights(model, path, device)
    ready_for_decoding(model, prepack, compile, weights, fuse)
    return LoadedModel(path=path, model=model, tokenizer=tokenizer, layout=layout, config=config, family=found)


def checkpoint_revision(path: str | Path) -> str:
    """A short fingerprint of a checkpoint directory for provenance: config, tokenizer and the
    names and sizes of its weight files (cheap: the weights themselves are not read)."""
    import hashlib

    path = Path(path)
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json"):
        if (path / name).is_file():
            digest.update((path / name).read_bytes())
    for f in sorted(path.glob("*.safetensors")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return digest.hexdigest()[:16]
