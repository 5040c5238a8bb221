"""Content-addressed groups cache: (embeddings, theta, cap, dedup, code ranges, family, format
version) -> one file.

A synthesis job calls `get_groups`; it loads the cached file or builds and stores it. Storage
is anything with `exists/get/put` of bytes by key (`BlobStore`); `LocalDirStore` is the local
filesystem one. An S3 store from the project's storage layer plugs in the same way.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from engine.groups.build import build_groups, check_cap, check_ranges, check_theta
from engine.groups.csr import SpeechGroups
from engine.groups.options import GroupsBuild
from engine.groups.source import embeddings_sha256
from engine.groups.store import FORMAT_VERSION, GroupFileError, deduplicate, from_bytes, to_bytes
from engine.io.storage import cache_dir, write_atomic


@runtime_checkable
class BlobStore(Protocol):
    """Bytes by key. Keys are file names (`[0-9a-f]+.safetensors`)."""

    def exists(self, key: str) -> bool: ...

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def where(self, key: str) -> str:
        """Where `key` lives, for messages (a path or URI)."""


class LocalDirStore:
    """A directory on the local filesystem; writes are atomic (temporary file + rename)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    def path(self, key: str) -> Path:
        if "/" in key or key.startswith("."):
            raise ValueError(f"bad cache key {key!r}")
        return self.root / key

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def put(self, key: str, data: bytes) -> None:
        write_atomic(self.path(key), data)

    def where(self, key: str) -> str:
        return str(self.path(key))


def default_cache_dir() -> Path:
    """`$PCG_SYNTH_CACHE/groups`, else `~/.cache/pcg-synth/groups`."""
    return cache_dir() / "groups"


def cache_key(embeddings_hash: str, theta: float, max_group_size: int | None, dedup: bool,
              ranges: Sequence[tuple[int, int]] | None = None, family: str | None = None) -> str:
    """The file name for one request: a hash of everything the groups depend on, and the family
    they are for. Several code ranges and a family enter the request only when given, so a
    one-range request without a family keeps the key it had before either existed (and its
    cached file)."""
    request = {"embeddings_sha256": embeddings_hash, "theta": float(theta),
               "max_group_size": max_group_size, "dedup": bool(dedup), "format_version": FORMAT_VERSION}
    if ranges is not None and len(ranges) > 1:
        request["ranges"] = [[int(start), int(size)] for start, size in ranges]
    if family is not None:
        request["family"] = family
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:40] + ".safetensors"


def build_with_metadata(
    embeddings: torch.Tensor | np.ndarray,
    build: GroupsBuild,
    embeddings_hash: str | None = None,
) -> SpeechGroups:
    """Build groups and record their provenance in `meta` (ready for `store.to_bytes`).

    Args:
        embeddings: the rows `[V, D]` to group.
        build: the request (`build.workers` 0 builds in this process, N >= 1 uses N Ray
            workers, `distributed.py`); `family` and `source` are recorded.
        embeddings_hash: the precomputed `embeddings_sha256(embeddings)`, if known.
    """
    start = time.perf_counter()
    if build.workers:
        from engine.groups.distributed import build_groups_distributed

        groups = build_groups_distributed(embeddings, build)
    else:
        groups = build_groups(embeddings, build.theta, build.max_group_size, progress=build.progress,
                              backend=build.backend, device=build.device, ranges=build.ranges)
    if build.dedup:
        groups = deduplicate(groups)
    groups.meta.update(family=build.family, source=build.source, embeddings_shape=list(embeddings.shape),
                       embeddings_sha256=embeddings_hash or embeddings_sha256(embeddings),
                       build_seconds=round(time.perf_counter() - start, 3))
    return groups


def get_groups(
    embeddings: torch.Tensor | np.ndarray,
    build: GroupsBuild,
    cache_dir: str | Path | None = None,
    store: BlobStore | None = None,
) -> SpeechGroups:
    """Groups for `embeddings` `[V, D]` from the cache, built and stored only when absent.

    Args:
        embeddings: the target's speech rows (`Synthesizer.speech_embeddings()`).
        build: the request. Its theta, cap, dedup, ranges (the target's `SpeechLayout.ranges`:
            no group mixes two) and family (`SpeechLayout.family`: a cached file for another
            family is refused, then rebuilt) are the key with the rows' hash; `source` is
            recorded, not keyed (the key hashes the rows themselves); backend, workers, device
            and progress only say how a miss builds (see `build_with_metadata`).
        cache_dir: a local cache directory (default `default_cache_dir()`); ignored with `store`.
        store: any `BlobStore` (e.g. object storage) instead of a local directory.

    Returns:
        The groups; `meta["cache"]` is `"hit"` or `"miss"` and `meta["cache_path"]` says where.
        A corrupt or mislabelled cached entry is rebuilt and replaced, with a warning.
    """
    theta, max_group_size = check_theta(build.theta), check_cap(build.max_group_size)
    ranges = check_ranges(build.ranges, len(embeddings))
    build = replace(build, theta=theta, max_group_size=max_group_size, ranges=ranges)
    store = store or LocalDirStore(cache_dir or default_cache_dir())
    emb_hash = embeddings_sha256(embeddings)
    key = cache_key(emb_hash, theta, max_group_size, build.dedup, ranges, build.family)
    expect = {"family": build.family, "ranges": ranges, "embeddings_sha256": emb_hash, "theta": theta,
              "max_group_size": max_group_size, "dedup": bool(build.dedup)}
    if store.exists(key):
        try:
            groups = from_bytes(store.get(key), store.where(key), expect)
            groups.meta.update(cache="hit", cache_path=store.where(key))
            return groups
        except GroupFileError as exc:
            warnings.warn(f"{exc}; rebuilding this cache entry", stacklevel=2)
    groups = build_with_metadata(embeddings, build, embeddings_hash=emb_hash)
    store.put(key, to_bytes(groups))
    groups.meta.update(cache="miss", cache_path=store.where(key))
    return groups
