"""Code-token embedding rows straight from a checkpoint directory, without loading the model:
only the family's code rows of one tensor are read (safetensors slices)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from engine.families import SpeechLayout, detect
from engine.groups.options import SOURCES
from engine.io.storage import model_dir
from engine.models.loading import (
    WEIGHT_SUFFIXES,
    ModelLoadError,
    load_tokenizer,
    read_config,
    safetensors_files,
)


def tensor_name(config: dict, source: str) -> str:
    """Which checkpoint tensor holds the rows: the input table, or the head (tied: the same)."""
    if source not in SOURCES:
        raise ValueError(f"embedding source must be one of {', '.join(SOURCES)}; got {source!r}")
    if source == "lm_head" and not config.get("tie_word_embeddings", False):
        return "lm_head.weight"
    return "model.embed_tokens.weight"


def find_tensor_file(path: Path, name: str) -> Path:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        if name in weight_map:
            return path / weight_map[name]
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            if name in f.keys():
                return file
    raise ModelLoadError(f"{path}: no tensor {name!r} in its safetensors files")


def checkpoint_layout(path: Path, config: dict) -> SpeechLayout:
    """The token layout of the checkpoint directory `path` (its family detected from its tokenizer).

    Raises:
        UnknownFamily: a tokenizer of no known family.
    """
    tokenizer = load_tokenizer(path)
    return detect(tokenizer, str(path)).layout(tokenizer, model_vocab_size=config["vocab_size"])


def load_speech_embeddings(checkpoint: str | Path, source: str = "input_embeddings") -> torch.Tensor:
    """`[codes, hidden]` code rows of a speech LM checkpoint, in the checkpoint's dtype, on CPU.

    The rows are located through the tokenizer (`checkpoint_layout`), never by assumed constants.

    Raises:
        ModelLoadError: missing directory, config, weights or tensor (a ValueError).
        ValueError: a tokenizer of no known family, or an unknown source.
    """
    return load_speech_rows(checkpoint, source)[0]


def load_speech_rows(checkpoint: str | Path,
                     source: str = "input_embeddings") -> tuple[torch.Tensor, SpeechLayout]:
    """`load_speech_embeddings` and the checkpoint's layout (its family and code ranges, which
    the groups are built within)."""
    path = model_dir(checkpoint)  # a directory, Hub model id or URI
    config = read_config(path)
    layout = checkpoint_layout(path, config)
    return stored_speech_rows(path, config, layout, source), layout


def stored_speech_rows(path: Path, config: dict, layout: SpeechLayout,
                       source: str = "input_embeddings") -> torch.Tensor:
    """The speech rows of the local checkpoint directory `path` (its `config`, its tokenizer's
    `layout`), as stored: `load_speech_embeddings` once the directory is resolved and read."""
    name = tensor_name(config, source)
    with safe_open(str(find_tensor_file(path, name)), framework="pt") as f:
        table = f.get_slice(name)
        rows = table.get_shape()[0]
        end = layout.first_code + layout.num_codes
        if rows < end:
            raise ModelLoadError(f"{path}: {name} has {rows} rows; the speech tokens need {end}")
        return table[layout.first_code:end]


def embeddings_sha256(embeddings: torch.Tensor | np.ndarray) -> str:
    """Content hash of an embedding matrix: its shape and float32 row-major bytes.

    float32 so the same values hash alike whatever dtype they arrived in (groups are computed
    from float32 unit rows anyway).
    """
    x = torch.as_tensor(embeddings).detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.sha256(f"float32{tuple(x.shape)}".encode())
    digest.update(x.numpy().tobytes())
    return digest.hexdigest()


# ---- from object storage: only the rows the groups need ---------------------------------------

ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def safetensors_header(storage, uri: str) -> tuple[dict, int]:
    """A safetensors file's header (tensor name -> dtype, shape, data_offsets) and where its data
    begins, read with two ranged reads."""
    import struct

    (n,) = struct.unpack("<Q", storage.read_range(uri, 0, 8))
    return json.loads(storage.read_range(uri, 8, 8 + n)), 8 + n


def read_rows(storage, uri: str, name: str, start: int, stop: int) -> torch.Tensor | None:
    """Rows `[start, stop)` of tensor `name` in the safetensors file at `uri`, by one ranged read
    (None if the file has no such tensor).

    Raises:
        ModelLoadError: the tensor is shorter than `stop` rows or of a dtype this reader lacks.
    """
    header, data_start = safetensors_header(storage, uri)
    entry = header.get(name)
    if entry is None:
        return None
    if entry["dtype"] not in ST_DTYPES:
        raise ModelLoadError(f"{uri}: {name} is {entry['dtype']}, not one of {', '.join(ST_DTYPES)}")
    dtype, shape = ST_DTYPES[entry["dtype"]], entry["shape"]
    if shape[0] < stop:
        raise ModelLoadError(f"{uri}: {name} has {shape[0]} rows; the speech tokens need {stop}")
    row = int(np.prod(shape[1:])) * torch.tensor([], dtype=dtype).element_size()
    begin = data_start + entry["data_offsets"][0]
    data = storage.read_range(uri, begin + start * row, begin + stop * row)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(stop - start, *shape[1:])


def speech_embeddings_of(storage, ref: str, source: str = "input_embeddings") -> torch.Tensor:
    """`speech_rows_of` without the layout."""
    return speech_rows_of(storage, ref, source)[0]


def speech_rows_of(storage, ref: str, source: str = "input_embeddings") -> tuple[torch.Tensor, SpeechLayout]:
    """The speech rows of the checkpoint `ref` as `load_speech_embeddings` gives them, and its
    layout (family and code ranges, for the groups), without fetching its weights when it lives
    in object storage: the small files (config, tokenizer) are copied to a temporary directory
    and the rows are read from the weights file by ranged reads (safetensors header, then
    exactly those rows). Local paths and Hub models are read in place (`load_speech_rows`).

    Raises:
        ModelLoadError: as `load_speech_embeddings`; StorageError: unreadable objects.
    """
    import tempfile

    from engine.io.storage import hub_ref, is_remote, join

    if hub_ref(ref) is not None or not is_remote(ref):
        return load_speech_rows(model_dir(ref, storage), source)
    prefix = str(ref).rstrip("/") + "/"
    objects = [u for u in storage.list(ref) if u.startswith(prefix)]
    small = [u for u in objects if not u.lower().endswith(WEIGHT_SUFFIXES)]
    with tempfile.TemporaryDirectory(prefix="pcg-synth-meta-") as tmp:
        for uri in small:
            target = Path(tmp) / uri[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(storage.read_bytes(uri))
        path = Path(tmp)
        config = read_config(path)
        name = tensor_name(config, source)
        layout = checkpoint_layout(path, config)
    index = join(ref.rstrip("/"), "model.safetensors.index.json")
    files = sorted(u for u in objects if u.lower().endswith(".safetensors"))
    if index in objects:
        mapped = json.loads(storage.read_bytes(index))["weight_map"].get(name)
        files = [join(ref.rstrip("/"), mapped)] if mapped else files
    end = layout.first_code + layout.num_codes
    for uri in files:
        rows = read_rows(storage, uri, name, layout.first_code, end)
        if rows is not None:
            return rows, layout
    raise ModelLoadError(f"{ref}: no tensor {name!r} in its safetensors files")
