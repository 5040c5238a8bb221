"""The codec interface the rest of the engine sees, code validation and length bucketing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

CodesLike = Sequence[int] | np.ndarray | torch.Tensor


class CodecError(ValueError):
    """Codes or audio the codec cannot take (empty, out of range, unreadable, wrong shape)."""


@runtime_checkable
class Codec(Protocol):
    """Speech codes <-> mono waveforms at the codec's rate. Codes come in frames of `frame_codes`
    (X-codec2: 1; SNAC as Orpheus lays it out: 7), each `frame_samples` samples of audio.

    Attributes:
        sample_rate: samples per second of every waveform in and out.
        frame_codes: codes per frame (an item's codes are whole frames).
        frame_samples: samples per frame (a decoded item has exactly `samples(codec, len(codes))`).
        codebook_size: codes are integers in `[0, codebook_size)`.
        fingerprint: identifies the weights (part of voice-prompt cache keys).
    """

    sample_rate: int
    frame_codes: int
    frame_samples: int
    codebook_size: int

    @property
    def fingerprint(self) -> str: ...

    def decode(self, codes: Sequence[CodesLike]) -> list[np.ndarray]:
        """One float32 waveform `[samples(codec, len(codes[i]))]` per item, in input order."""
        ...

    def encode(self, waveforms: Sequence[np.ndarray]) -> list[list[int]]:
        """One code list (whole frames) per float32 mono waveform `[N]` at `sample_rate`."""
        ...


class CodecBase:
    """What the codecs share: `decode` and `decode_iter` over equal-length batches
    (`decode_batch`, every item checked first by `check_codes`; `max_batch` items and
    `max_batch_codes` codes a batch at most), `encode` one clip at a time (`encode_one`), and the
    `fingerprint` of the checkpoint at `path` (its config and `weight_paths()`)."""

    max_batch: int
    max_batch_codes: int | None
    path: Path | None
    _fingerprint: str | None = None

    def decode(self, codes: Sequence[CodesLike]) -> list[np.ndarray]:
        """Decode items, batching equal lengths; waveforms come back in input order, one float32
        `[samples(codec, len(codes[i]))]` at `sample_rate` per item.

        Raises:
            CodecError: an item the codec cannot take (nothing is decoded).
        """
        arrays = [self.check_codes(c, f"item {i}") for i, c in enumerate(codes)]
        out: list[np.ndarray | None] = [None] * len(arrays)
        for batch in length_batches([len(a) for a in arrays], self.max_batch, self.max_batch_codes):
            audio = self.decode_batch(np.stack([arrays[i] for i in batch]))
            for row, i in enumerate(batch):
                out[i] = audio[row].copy()  # a copy frees the batch array once all rows are out
        return out  # type: ignore[return-value]

    def decode_iter(self, codes: Iterable[CodesLike], window: int = 256) -> Iterator[np.ndarray]:
        """Stream waveforms in input order, holding at most `window` items' audio at a time."""
        chunk: list[CodesLike] = []
        for c in codes:
            chunk.append(c)
            if len(chunk) == window:
                yield from self.decode(chunk)
                chunk = []
        if chunk:
            yield from self.decode(chunk)

    def encode(self, waveforms: Sequence[np.ndarray]) -> list[list[int]]:
        """Codes of each waveform; one at a time, since the encoder's convolutions would see
        padding (prompts are few and cached, see `engine.codec.prompts`)."""
        return [self.encode_one(w) for w in waveforms]

    @property
    def fingerprint(self) -> str:
        """sha256 of the checkpoint's config and weights: part of every prompt-cache key.

        Raises:
            CodecError: a random-weight codec (no checkpoint)."""
        if self._fingerprint is None:
            if self.path is None:
                raise CodecError("a random-weight codec has no fingerprint")
            digest = hashlib.sha256((self.path / "config.json").read_bytes())
            for file in self.weight_paths():
                with open(file, "rb") as f:
                    for block in iter(lambda: f.read(1 << 24), b""):
                        digest.update(block)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint


def codec_config(path: Path, how_to_get: str) -> dict:
    """A codec checkpoint directory's `config.json`.

    Raises:
        CodecError: no such directory, or no config in it (the message says how to get one).
    """
    if not path.is_dir():
        raise CodecError(f"codec directory {path} does not exist. {how_to_get}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CodecError(f"{path} has no config.json. {how_to_get}")
    return json.loads(cfg_file.read_text())


def samples(codec: Codec, num_codes: int) -> int:
    """Audio samples of `num_codes` codes (whole frames) decoded by `codec`."""
    return num_codes // codec.frame_codes * codec.frame_samples


def seconds(codec: Codec, num_codes: int) -> float:
    return samples(codec, num_codes) / codec.sample_rate


def as_code_array(codes: CodesLike, codebook_size: int | None, name: str = "codes") -> np.ndarray:
    """Check one item's codes and return them as `int64 [T]` (`codebook_size` None: any code >= 0).

    Raises:
        CodecError: empty, not one-dimensional, not integers, or outside `[0, codebook_size)`.
    """
    arr = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
    if arr.ndim != 1:
        raise CodecError(f"{name}: expected a flat list of codes, got shape {tuple(arr.shape)}")
    if arr.size == 0:
        raise CodecError(f"{name}: no codes to decode (empty)")
    if not np.issubdtype(arr.dtype, np.integer):
        raise CodecError(f"{name}: codes must be integers, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= (codebook_size or np.iinfo(np.int64).max)))
    if bad.size:
        i = int(bad[0])
        where = f"outside [0, {codebook_size})" if codebook_size else "negative"
        raise CodecError(f"{name}: code {int(arr[i])} at position {i} is {where} ({bad.size} such codes)")
    return arr.astype(np.int64, copy=False)


def length_batches(lengths: Sequence[int], max_batch: int, max_batch_codes: int | None = None
                   ) -> list[list[int]]:
    """Group item indices into batches whose items all have the same length.

    X-codec2's decoder is non-causal and takes no attention mask, so padding would leak into
    every padded item: only equal lengths may share a batch.

    Args:
        lengths: code count of each item.
        max_batch: items per batch at most.
        max_batch_codes: total codes per batch at most (bounds activation memory); an item
            longer than this still gets a batch of its own.

    Returns:
        Lists of indices into `lengths`, longest lengths first (a memory spike shows up early);
        within a length, indices keep input order.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1; got {max_batch}")
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(int(n), []).append(i)
    batches = []
    for n in sorted(by_length, reverse=True):
        cap = max_batch if not max_batch_codes else max(1, min(max_batch, max_batch_codes // max(n, 1)))
        idx = by_length[n]
        batches.extend(idx[k:k + cap] for k in range(0, len(idx), cap))
    return batches
