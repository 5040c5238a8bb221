"""`draft init`: a draft checkpoint made of chosen layers of a model that shares the target's
vocabulary (by default the target itself: the paper's recipe), saved in Hugging Face format.

The output is a normal `LlamaForCausalLM` directory: the source's embeddings, the chosen decoder
layers renumbered 0..n-1, the final norm and, for untied sources, the full `lm_head` (our loader
slices it to speech + end-of-speech at load time, transformers loads it as is). Tensors are
streamed one at a time from the source's safetensors and written in bounded shards, so an
8B source is never materialised in memory.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.families import detect
from engine.io.storage import model_dir
from engine.models.loading import (
    DRAFT_INFO,
    NOT_COPIED,
    WEIGHT_SUFFIXES,
    LoadedModel,
    check_same_vocabulary,
    load_tokenizer,
    read_config,
    safetensors_files,
)

LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
DEFAULT_SHARD_BYTES = 2 * 1024**3


def parse_layers(text: str | Sequence[int]) -> list[int]:
    """`"0,1,15"` (or a sequence) -> `[0, 1, 15]`.

    Raises:
        ValueError: not a comma-separated list of integers.
    """
    if not isinstance(text, str):
        return [int(x) for x in text]
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers must be comma-separated layer numbers like 0,1,15; got {text!r}") from None


def check_layers(layers: Sequence[int], num_layers: int, source: Path) -> list[int]:
    """Layers must be distinct and exist in the source (they are applied in the order given).

    Raises:
        ValueError: empty, repeated or out-of-range layers.
    """
    layers = list(layers)
    if not layers:
        raise ValueError("choose at least one layer (e.g. --layers 0,1,15)")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers repeat: {layers}")
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{source} has layers 0..{num_layers - 1}; {bad} do not exist")
    return layers


def vocabulary_view(path: str | Path) -> LoadedModel:
    """Tokenizer, layout and config of a checkpoint without its weights (for vocabulary checks)."""
    path = model_dir(path)
    config = read_config(path)
    tokenizer = load_tokenizer(path)
    family = detect(tokenizer, str(path))
    layout = family.layout(tokenizer, model_vocab_size=config["vocab_size"])
    return LoadedModel(path=path, model=None, tokenizer=tokenizer, layout=layout, config=config, family=family)


def check_vocabularies(target: str | Path, draft: str | Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's (same check as decoding).

    Raises:
        ValueError: the token layouts or the tokenizer vocabularies differ.
    """
    check_same_vocabulary(vocabulary_view(target), vocabulary_view(draft))


def renamed_tensors(source: Path, layers: Sequence[int]) -> Iterator[tuple[str, str]]:
    """(source name, draft name) of every tensor the draft keeps, in a stable order."""
    new_index = {old: new for new, old in enumerate(layers)}
    names = []
    for file in safetensors_files(source):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names.extend(f.keys())
    for name in sorted(names):
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer some old checkpoints carry; recomputed from the config
        match = LAYER_KEY.match(name)
        if match is None:
            yield name, name
        elif int(match.group(1)) in new_index:
            yield name, f"model.layers.{new_index[int(match.group(1))]}.{match.group(2)}"


def stream_tensors(source: Path, layers: Sequence[int], overrides: dict[str, torch.Tensor] | None = None,
                   progress: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the draft's tensors one at a time, read lazily from the source's safetensors.

    Args:
        source: checkpoint directory.
        layers: source layers to keep, renumbered in this order.
        overrides: draft name -> tensor replacing the stored one (cast to the stored dtype);
            how trained weights are written back.
        progress: show a progress bar.
    """
    overrides = overrides or {}
    where = {}
    for file in safetensors_files(source):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            where.update({k: file for k in f.keys()})
    pairs = list(renamed_tensors(source, layers))
    unknown = sorted(set(overrides) - {new for _, new in pairs})
    if unknown:
        raise ValueError(f"trained tensors {unknown[:3]} are not in {source}")
    for old, new in tqdm(pairs, desc="tensors", unit="t", disable=bar_disabled(progress)):
        with safe_open(str(where[old]), framework="pt", device="cpu") as f:
            stored = f.get_tensor(old)
        if new in overrides:
            value = overrides[new].detach().to("cpu", stored.dtype)
            if value.shape != stored.shape:
                raise ValueError(f"{new}: trained shape {tuple(value.shape)} != stored {tuple(stored.shape)}")
            stored = value
        yield new, stored


def write_safetensors(out: Path, tensors: Iterator[tuple[str, torch.Tensor]],
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[str]:
    """Write tensors into `model.safetensors`, or `model-0000k-of-0000n.safetensors` shards with
    an index when they exceed `max_shard_bytes`; memory holds at most one shard. Returns the
    file names."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size, written = 0, []
    tmp_names: list[str] = []

    def flush() -> None:
        name = f".shard-{len(tmp_names):05d}.tmp"
        save_file({k: v.contiguous() for k, v in shards[-1].items()}, str(out / name),
                  metadata={"format": "pt"})
        tmp_names.append(name)
        written.append(sorted(shards[-1]))
        shards[-1] = {}

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            flush()
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    flush()
    if len(tmp_names) == 1:
        (out / tmp_names[0]).rename(out / "model.safetensors")
        return ["model.safetensors"]
    n, weight_map, names = len(tmp_names), {}, []
    for i, (tmp, keys) in enumerate(zip(tmp_names, written), 1):
        final = f"model-{i:05d}-of-{n:05d}.safetensors"
        (out / tmp).rename(out / final)
        weight_map.update({k: final for k in keys})
        names.append(final)
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names


def draft_config(config: dict, layers: Sequence[int]) -> dict:
    """The source config with `num_hidden_layers` (and any per-layer list) cut to `layers`."""
    out = dict(config)
    out["num_hidden_layers"] = len(layers)
    for key in ("layer_types",):  # per-layer lists some configs carry
        if isinstance(out.get(key), list) and len(out[key]) == config["num_hidden_layers"]:
            out[key] = [config[key][i] for i in layers]
    return out


def copy_side_files(source: Path, out: Path) -> None:
    """Tokenizer, chat template, generation config: every plain file that is not weights."""
    for f in sorted(source.iterdir()):
        if f.is_file() and f.name not in NOT_COPIED and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy(f, out / f.name)


def prepare_out(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out} is not empty; pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def save_draft(source: Path, layers: Sequence[int], out: Path, info: dict,
               overrides: dict[str, torch.Tensor] | None = None,
               max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = False) -> Path:
    """Write `source`'s `layers` (with `overrides` applied) as a Hugging Face checkpoint at
    `out` (which must exist and be empty of weights)."""
    config = draft_config(read_config(source), layers)
    copy_side_files(source, out)
    write_safetensors(out, stream_tensors(source, layers, overrides, progress), max_shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / DRAFT_INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
    return out


def init_draft(target: str | Path, out: str | Path, layers: Sequence[int] | str | None = None,
               source: str | Path | None = None, force: bool = False,
               max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = False) -> Path:
    """Build a draft for `target` at `out`.

    Args:
        target: the target checkpoint directory.
        out: where the draft goes (created; must be empty unless `force`).
        layers: source layers to keep, in order (e.g. `[0, 1, 15]`); None keeps all of them
            (a whole same-vocabulary model, e.g. Llasa-1B for Llasa-8B).
        source: where layers come from; None means the target itself.
        force: replace a non-empty `out`.
        max_shard_bytes: largest safetensors shard written.
        progress: show a progress bar.

    Returns:
        `out`.

    Raises:
        ValueError: bad layers, or a source whose vocabulary differs from the target's.
        ModelLoadError: a directory is missing or not a Llama checkpoint.
        FileExistsError: `out` is not empty and `force` is not set.
    """
    target, out = model_dir(target), Path(out)  # Hub ids and URIs: their local copies
    src = model_dir(source) if source is not None else target
    if isinstance(layers, str):
        layers = parse_layers(layers)
    if layers is None and src.resolve() == target.resolve():
        raise ValueError("give --layers (a subset of the target's layers, e.g. 0,1,15) or --source "
                         "(a smaller model with the target's vocabulary)")
    if src.resolve() != target.resolve():
        check_vocabularies(target, src)
    n_source = read_config(src)["num_hidden_layers"]
    layers = check_layers(layers if layers is not None else range(n_source), n_source, src)
    prepare_out(out, force)
    info = {"tool": "pcg-synth draft init", "source": src.name, "source_layers": n_source,
            "layers": layers, "trained": None}
    return save_draft(src, layers, out, info, max_shard_bytes=max_shard_bytes, progress=progress)
