"""Speech-token embedding rows straight from a checkpoint directory, without loading the model:
only the 65,536 speech rows of one tensor are read (safetensors slices)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from engine.io.storage import model_dir
from engine.models.llasa import LlasaLayout
from engine.models.loading import ModelLoadError, load_tokenizer, read_config, safetensors_files

SOURCES = ("input_embeddings", "lm_head")


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


def load_speech_embeddings(checkpoint: str | Path, source: str = "input_embeddings") -> torch.Tensor:
    """`[65536, hidden]` speech rows of a Llasa checkpoint, in the checkpoint's dtype, on CPU.

    The speech rows are located through the tokenizer (`LlasaLayout.from_tokenizer`), never by
    assumed constants.

    Raises:
        ModelLoadError: missing directory, config, weights or tensor (a ValueError).
        ValueError: not a Llasa tokenizer, or an unknown source.
    """
    path = model_dir(checkpoint)  # a directory, Hub model id or URI
    config = read_config(path)
    name = tensor_name(config, source)
    layout = LlasaLayout.from_tokenizer(load_tokenizer(path), model_vocab_size=config["vocab_size"])
    with safe_open(str(find_tensor_file(path, name)), framework="pt") as f:
        table = f.get_slice(name)
        rows = table.get_shape()[0]
        end = layout.first_speech + layout.num_speech
        if rows < end:
            raise ModelLoadError(f"{path}: {name} has {rows} rows; the speech tokens need {end}")
        return table[layout.first_speech:end]


def embeddings_sha256(embeddings: torch.Tensor | np.ndarray) -> str:
    """Content hash of an embedding matrix: its shape and float32 row-major bytes.

    float32 so the same values hash alike whatever dtype they arrived in (groups are computed
    from float32 unit rows anyway).
    """
    x = torch.as_tensor(embeddings).detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.sha256(f"float32{tuple(x.shape)}".encode())
    digest.update(x.numpy().tobytes())
    return digest.hexdigest()
