"""Similarity-search backends: candidate pairs whose float32 cosine is at least a floor.

A backend only proposes candidates (query, member, float32 cosine). Which candidates become
group members is decided in `engine.groups.build`, the same way for every backend, so faiss and
torch builds give identical groups. Backends:

- `faiss`: exact inner-product search over an `IndexFlatIP`. faiss-cpu on the host, or the faiss
  GPU build when it is installed *and* `faiss.get_num_gpus() > 0` (a faiss GPU call without a
  GPU aborts the process instead of raising). GPU faiss has no range search, so it runs kNN with
  k = 2048 and falls back to the CPU index for queries with more neighbours
  (`faiss.contrib.exhaustive_search.range_search_gpu`).
- `torch`: one float32 matmul per block of query rows against the whole table, on any device
  (the GPU backend where faiss has no GPU build).

With code ranges (Orpheus: one range of ids per frame position) `RangeSearcher` gives each range
its own backend over that range's rows only, so no candidate ever crosses a range: the
threshold, the cap and the symmetrisation downstream then see same-range pairs only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import torch

from engine.groups.options import BACKENDS

FAISS_GPU_K = 2048  # the largest k faiss GPU kNN supports


class Candidates(NamedTuple):
    """Candidate pairs of one slice of query rows, in no particular order."""

    rows: np.ndarray  # [P] int64 global query ids
    cols: np.ndarray  # [P] int64 member ids
    sims: np.ndarray  # [P] float64 cosines as the backend computed them (float32 precision)


class Searcher(Protocol):
    name: str

    def __call__(self, lo: int, hi: int, floor: float) -> Candidates:
        """Pairs `(q, t)` with `lo <= q < hi` and backend cosine >= `floor` (a superset is fine)."""


def exact_cosines(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Canonical cosines: float64 dot products of the float32 unit rows, `[P]` pairs -> `[P]`.

    Every backend's close calls are settled by this one function, so backends cannot disagree
    on them; the products commute, so `(a, b)` and `(b, a)` sum the same terms.
    """
    out = np.empty(len(rows), dtype=np.float64)
    for s in range(0, len(rows), chunk):
        a = x[rows[s:s + chunk]].astype(np.float64)
        b = x[cols[s:s + chunk]].astype(np.float64)
        out[s:s + chunk] = np.einsum("ij,ij->i", a, b)
    return out


def faiss_importable() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_gpu_available() -> bool:
    """True only when a faiss GPU build sees a GPU; never calls a GPU function otherwise."""
    if not faiss_importable():
        return False
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def choose_backend(backend: str, on_gpu: bool, faiss_installed: bool, faiss_gpus: int) -> str:
    """The backend choice, from what the machine has: `auto` | `faiss` | `torch` ->
    `faiss-gpu` | `faiss-cpu` | `torch`.

    `faiss_gpus` is the number of GPUs a faiss GPU build sees (0 for faiss-cpu or no GPU). `auto`
    prefers faiss (faster than torch on CPU); on a CUDA device it takes faiss only where the GPU
    build sees a GPU, else torch on the GPU rather than faiss-cpu on the host.

    Raises:
        ValueError: unknown backend, or `faiss` asked for but not installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "torch":
        return "torch"
    if not faiss_installed:
        if backend == "faiss":
            raise ValueError("backend 'faiss' needs the faiss package (pip install 'pcg-synth[cpu]', or "
                             "'pcg-synth[gpu]' for the GPU build); use backend 'torch' instead")
        return "torch"
    if on_gpu and faiss_gpus > 0:
        return "faiss-gpu"
    if backend == "auto" and on_gpu:
        return "torch"
    return "faiss-cpu"


def resolve_backend(backend: str, device: torch.device) -> str:
    """`choose_backend` for this machine and `device` (never calls a faiss GPU function
    without a GPU build that sees one)."""
    gpus = 0
    if faiss_gpu_available():
        import faiss

        gpus = faiss.get_num_gpus()
    return choose_backend(backend, device.type == "cuda", faiss_importable(), gpus)


class TorchSearcher:
    """Block matmul on `device`: `[block, D] @ [D, V]` cosines per step."""

    name = "torch"

    def __init__(self, x: np.ndarray, device: torch.device, block: int = 1024) -> None:
        self.x = torch.as_tensor(np.ascontiguousarray(x)).to(device)  # [V, D] float32, unit rows
        self.block = block

    def __call__(self, lo: int, hi: int, floor: float) -> Candidates:
        rows, cols, sims = [], [], []
        # TF32 matmuls would round cosines by ~1e-3: keep full float32 while searching.
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            for start in range(lo, hi, self.block):
                stop = min(start + self.block, hi)
                block = self.x[start:stop] @ self.x.T  # [blk, V]
                r, c = (block >= floor).nonzero(as_tuple=True)
                rows.append((r + start).cpu().numpy())
                cols.append(c.cpu().numpy())
                sims.append(block[r, c].cpu().numpy())
        finally:
            torch.set_float32_matmul_precision(precision)
        return Candidates(np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64),
                          np.concatenate(sims).astype(np.float64))


@functools.cache
def gpu_resources():
    """One faiss GPU resources object per process, shared by every index (each reserves scratch
    memory on the GPU; a build within code ranges holds one index per range)."""
    import faiss

    return faiss.StandardGpuResources()


class FaissSearcher:
    """Exact inner-product range search over an `IndexFlatIP` (faiss-cpu or faiss GPU)."""

    def __init__(self, x: np.ndarray, gpu: bool = False) -> None:
        import faiss

        self.x = np.ascontiguousarray(x, dtype=np.float32)  # [V, D] unit rows
        self.cpu_index = faiss.IndexFlatIP(self.x.shape[1])
        self.cpu_index.add(self.x)
        self.gpu_index = None
        if gpu:  # only reached when faiss_gpu_available() said yes
            self.resources = gpu_resources()
            self.gpu_index = faiss.index_cpu_to_gpu(self.resources, 0, self.cpu_index)
        self.name = "faiss-gpu" if gpu else "faiss-cpu"

    def __call__(self, lo: int, hi: int, floor: float) -> Candidates:
        queries = self.x[lo:hi]
        # faiss keeps inner products strictly above the radius; the floor is below theta anyway.
        if self.gpu_index is None:
            lims, sims, ids = self.cpu_index.range_search(queries, float(floor))
        else:
            from faiss.contrib.exhaustive_search import range_search_gpu

            k = min(FAISS_GPU_K, self.x.shape[0])
            lims, sims, ids = range_search_gpu(queries, float(floor), self.gpu_index,
                                               self.cpu_index, gpu_k=k)
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(lims.astype(np.int64)))
        return Candidates(rows, ids.astype(np.int64), sims.astype(np.float64))


def make_searcher(x: np.ndarray, backend: str = "auto", device: str | torch.device = "cpu",
                  block: int = 1024) -> Searcher:
    """A searcher over the unit rows `x` `[V, D]` float32 for `backend` on `device`."""
    device = torch.device(device)
    resolved = resolve_backend(backend, device)
    if resolved == "torch":
        return TorchSearcher(x, device, block)
    return FaissSearcher(x, gpu=resolved == "faiss-gpu")


class RangeSearcher:
    """One backend per code range, each over its range's rows only; a query slice must lie inside
    one range. Candidates come back in table ids (the range's first row added back).

    Args:
        x: `[V, D]` float32 unit rows.
        ranges: `(first row, size)` pairs tiling `0..V-1` (`options.check_ranges`).
        make: builds a backend over a block of rows (`make_searcher` with its settings).
    """

    def __init__(self, x: np.ndarray, ranges: Sequence[tuple[int, int]], make) -> None:
        self.ranges = [(int(start), int(size)) for start, size in ranges]
        self.searchers = [make(x[start:start + size]) for start, size in self.ranges]  # views, no copies
        self.starts = np.array([start for start, _ in self.ranges], dtype=np.int64)
        self.name = self.searchers[0].name

    def __call__(self, lo: int, hi: int, floor: float) -> Candidates:
        k = int(np.searchsorted(self.starts, lo, side="right")) - 1
        start, size = self.ranges[k]
        if hi > start + size:
            raise ValueError(f"query rows {lo}..{hi - 1} cross the end of code range {start}..{start + size - 1}")
        c = self.searchers[k](lo - start, hi - start, floor)
        return Candidates(c.rows + start, c.cols + start, c.sims)


def make_range_searcher(x: np.ndarray, ranges: Sequence[tuple[int, int]], backend: str = "auto",
                        device: str | torch.device = "cpu", block: int = 1024) -> RangeSearcher:
    """`make_searcher` for each code range of `x` (checked ranges; see `RangeSearcher`)."""
    return RangeSearcher(x, ranges, lambda rows: make_searcher(rows, backend, device, block))
