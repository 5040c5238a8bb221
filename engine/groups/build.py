"""Range search over speech-token embeddings -> Acoustic Similarity Groups (docs/pcg.md section 2).

`G(t) = { t' : cos(e_t, e_t') >= theta }`, every token in its own group.

Identical results whatever the backend or the number of workers: a backend (`search.py`) only
proposes candidates whose float32 cosine is >= `theta - EXACT_BAND`; pairs within `EXACT_BAND`
of the threshold are then decided on a canonical float64 cosine of the same float32 unit rows
(`exact_cosines`), which does not depend on the backend's summation order. Away from the
threshold the float32 error (< 2e-4 for unit vectors at D = 2048, ~1e-6 in practice) cannot
change a decision. The same holds for the cut at `max_group_size` (`cap.py`).

Code ranges (`ranges`, e.g. Orpheus's seven frame positions of 4,096 ids): each range's rows are
searched against that range's rows only (`search.RangeSearcher`) and query slices never cross a
range's end, so a group never mixes ranges, the cap ranks same-range candidates only, and every
range's groups are exactly those of building that range alone (ids offset by its first row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.groups.cap import apply_cap
from engine.groups.csr import SpeechGroups
from engine.groups.options import check_cap, check_ranges, check_theta
from engine.groups.search import Candidates, Searcher, exact_cosines, make_range_searcher
from engine.models.device import resolve_device

EXACT_BAND = 1e-3  # cosines this close to a decision boundary are recomputed in float64
SLICE_ROWS = 4096  # query rows per slice: a unit of progress and of distributed work


def normalise(embeddings: torch.Tensor) -> torch.Tensor:
    """L2-normalised float32 rows."""
    x = embeddings.float()
    norms = x.norm(dim=-1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("an embedding row is all zeros: its cosine similarity is undefined")
    return x / norms


def unit_rows(embeddings: torch.Tensor | np.ndarray) -> np.ndarray:
    """`[V, D]` -> host float32 unit rows, C-contiguous: the one input every backend sees."""
    if embeddings.ndim != 2 or embeddings.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty [tokens, dim] matrix; got shape "
                         f"{tuple(embeddings.shape)}")
    x = normalise(torch.as_tensor(embeddings).detach())
    return np.ascontiguousarray(x.cpu().numpy())


def threshold(x: np.ndarray, cand: Candidates, lo: int, hi: int, theta: float) -> Candidates:
    """Members of `G(q)` for `lo <= q < hi` from candidates found at a floor <= `theta - EXACT_BAND`.

    Self pairs are forced in with similarity +inf (a token is always in its own group, even
    at theta = 1 where its float cosine with itself may round below 1).
    """
    other = cand.rows != cand.cols
    rows, cols, sims = cand.rows[other], cand.cols[other], cand.sims[other].copy()
    near = np.abs(sims - theta) < EXACT_BAND  # the only pairs float32 rounding could misjudge
    sims[near] = exact_cosines(x, rows[near], cols[near])
    keep = sims >= theta
    own = np.arange(lo, hi, dtype=np.int64)
    return Candidates(np.concatenate([own, rows[keep]]), np.concatenate([own, cols[keep]]),
                      np.concatenate([np.full(hi - lo, np.inf), sims[keep]]))


@dataclass
class Slice:
    """Groups of query rows `lo..hi-1` as a CSR fragment (what a worker sends back)."""

    lo: int
    hi: int
    indptr: np.ndarray  # [hi - lo + 1] int64, local offsets
    members: np.ndarray  # [nnz] int32, sorted within each row
    full_sizes: np.ndarray  # [hi - lo] int32 group sizes before the cap
    truncated: int


def search_slice(searcher: Searcher, x: np.ndarray, lo: int, hi: int, theta: float,
                 max_group_size: int | None) -> Slice:
    """Decide the groups of query rows `lo..hi-1` against the rows `searcher` searches (the
    whole table, or the query rows' code range)."""
    kept = threshold(x, searcher(lo, hi, theta - EXACT_BAND), lo, hi, theta)
    full_sizes = np.bincount(kept.rows - lo, minlength=hi - lo).astype(np.int32)
    truncated = 0
    if max_group_size is not None:
        kept, truncated = apply_cap(x, kept, lo, hi, max_group_size, EXACT_BAND)
    order = np.lexsort((kept.cols, kept.rows))
    counts = np.bincount(kept.rows - lo, minlength=hi - lo)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Slice(lo, hi, indptr, kept.cols[order].astype(np.int32), full_sizes, truncated)


def slice_bounds(num_tokens: int, slice_rows: int = SLICE_ROWS,
                 ranges: Sequence[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Query slices of at most `slice_rows` rows, none crossing the end of a code range."""
    return [(lo, min(lo + slice_rows, start + size))
            for start, size in check_ranges(ranges, num_tokens)
            for lo in range(start, start + size, slice_rows)]


def pairs_to_csr(rows: np.ndarray, cols: np.ndarray, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, de-duplicated (row, col) pairs -> (indptr, members)."""
    keys = np.unique(rows.astype(np.int64) * num_tokens + cols.astype(np.int64))
    r, c = np.divmod(keys, num_tokens)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=num_tokens))]).astype(np.int64)
    return indptr, c


def member_dtype(num_tokens: int) -> np.dtype:
    return np.dtype(np.uint16) if num_tokens <= 65536 else np.dtype(np.int32)


def assemble(slices: list[Slice], num_tokens: int, theta: float, max_group_size: int | None,
             ranges: Sequence[tuple[int, int]] | None = None) -> SpeechGroups:
    """Merge slice fragments (any order) into one CSR; `meta["ranges"]` records the code ranges
    (`[start, size]` lists) the slices were searched within.

    Uncapped groups are symmetrised (union with the transpose); with exact decisions this adds
    nothing, and `meta["symmetrised_pairs"]` reports it if it ever does. Capped groups may be
    asymmetric by design; the decoding index uses their transpose for S(t).
    """
    slices = sorted(slices, key=lambda s: s.lo)
    edges = [0] + [s.hi for s in slices]
    if [s.lo for s in slices] != edges[:-1] or edges[-1] != num_tokens:
        raise ValueError(f"slices {[(s.lo, s.hi) for s in slices]} do not tile 0..{num_tokens}")
    members = np.concatenate([s.members for s in slices]).astype(np.int64)
    sizes = np.concatenate([np.diff(s.indptr) for s in slices])
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    added = 0
    if max_group_size is None:
        rows = np.repeat(np.arange(num_tokens, dtype=np.int64), sizes)
        indptr, members = pairs_to_csr(np.concatenate([rows, members]),
                                       np.concatenate([members, rows]), num_tokens)
        added = int(indptr[-1] - sizes.sum())
    full_sizes = np.concatenate([s.full_sizes for s in slices])
    full_sizes = full_sizes if max_group_size is not None else None
    return SpeechGroups(indptr=indptr, members=members.astype(member_dtype(num_tokens)), theta=theta,
                        num_tokens=num_tokens, max_group_size=max_group_size,
                        truncated=sum(s.truncated for s in slices), full_sizes=full_sizes,
                        meta={"symmetrised_pairs": added,
                              "ranges": [[start, size] for start, size in check_ranges(ranges, num_tokens)]})


def build_groups(
    embeddings: torch.Tensor | np.ndarray,
    theta: float,
    max_group_size: int | None = None,
    block: int = 1024,
    progress: bool = False,
    backend: str = "auto",
    device: str | torch.device | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
) -> SpeechGroups:
    """Groups for every row of `embeddings` `[V, D]`, in this process.

    Args:
        embeddings: speech-token embedding rows (any float dtype, any device).
        theta: cosine threshold in (0, 1].
        max_group_size: keep at most this many members per group (itself first, then the most
            similar, ties by id); groups cut this way are counted in `truncated`.
        block: query rows per torch matmul.
        progress: show a progress bar.
        backend: `auto` (faiss where importable, GPU build only with a GPU), `faiss` or `torch`.
        device: where the search runs (`None`/`auto`: CUDA where available).
        ranges: code ranges, `(first row, size)` pairs tiling `0..V-1` in order: a group holds
            rows of one range only (None: one range, every row).

    Raises:
        ValueError: theta outside (0, 1], a bad cap, a zero row, an unknown backend, ranges that
            do not tile the rows.
    """
    theta, max_group_size = check_theta(theta), check_cap(max_group_size)
    x = unit_rows(embeddings)
    ranges = check_ranges(ranges, x.shape[0])
    searcher = make_range_searcher(x, ranges, backend, resolve_device(device), block)
    bounds = slice_bounds(x.shape[0], ranges=ranges)
    slices = [search_slice(searcher, x, lo, hi, theta, max_group_size)
              for lo, hi in tqdm(bounds, desc=f"groups theta={theta:g}", unit="slice",
                                 disable=bar_disabled(progress))]
    groups = assemble(slices, x.shape[0], theta, max_group_size, ranges)
    groups.meta["backend"] = searcher.name
    return groups
