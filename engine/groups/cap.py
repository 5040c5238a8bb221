"""The `max_group_size` cut: keep each over-full group's `cap` best members, identically for every
backend (docs/pcg.md section 2: a cap is allowed if truncated groups are counted).

Ranking: the token itself first, then by cosine (descending), ties by id (ascending). Backend
cosines carry float32 rounding, so members within `band` of the cut-off cosine are re-ranked on
the canonical float64 cosine; the proof that this picks exactly the canonical top `cap` needs
only that the backend error is below `band / 2`:
with `v` the backend cosine at rank `cap`, members with backend cosine >= `v + band` are
certainly in (fewer than `cap` members beat `v`), those <= `v - band` certainly out (at least
`cap` members reach `v`), and the ambiguous rest fill the remaining places in canonical order.
"""

from __future__ import annotations

import numpy as np

from engine.groups.search import Candidates, exact_cosines


def rank_in_row(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted ascending: (position of each entry within its row, start of its row)."""
    change = np.flatnonzero(np.diff(rows)) + 1
    starts = np.concatenate([[0], change])
    start_of = np.repeat(starts, np.diff(np.concatenate([starts, [len(rows)]])))
    return np.arange(len(rows)) - start_of, start_of


def sort_rows_best_first(c: Candidates, sure: np.ndarray | None = None) -> Candidates:
    """Order entries by row, then (sure first,) cosine descending, then id ascending."""
    keys = (c.cols, -c.sims) + ((~sure,) if sure is not None else ()) + (c.rows,)
    order = np.lexsort(keys)
    return Candidates(c.rows[order], c.cols[order], c.sims[order])


def cut_rows(kept: Candidates, x: np.ndarray, cap: int, band: float) -> Candidates:
    """Top `cap` members of every row of `kept` (all rows here hold more than `cap`)."""
    c = sort_rows_best_first(kept)
    rank, start_of = rank_in_row(c.rows)
    cutoff = c.sims[start_of + cap - 1]  # [P] backend cosine at rank `cap` of each row
    sure = c.sims >= cutoff + band
    ambiguous = ~sure & (c.sims > cutoff - band)
    sims = c.sims.copy()
    sims[ambiguous] = exact_cosines(x, c.rows[ambiguous], c.cols[ambiguous])
    pool = sure | ambiguous
    c = Candidates(c.rows[pool], c.cols[pool], sims[pool])
    c = sort_rows_best_first(c, sure[pool])
    rank, _ = rank_in_row(c.rows)
    keep = rank < cap
    return Candidates(c.rows[keep], c.cols[keep], c.sims[keep])


def apply_cap(x: np.ndarray, kept: Candidates, lo: int, hi: int, cap: int,
              band: float) -> tuple[Candidates, int]:
    """Cut the groups of rows `lo..hi-1` to at most `cap` members.

    Args:
        x: `[V, D]` float32 unit rows (for canonical cosines).
        kept: the members after thresholding; self pairs carry cosine +inf.
        cap: `max_group_size`.
        band: half-width of the re-ranking band around each row's cut-off cosine.

    Returns:
        (the kept members, the number of groups that were cut).
    """
    counts = np.bincount(kept.rows - lo, minlength=hi - lo)
    over = (counts > cap)[kept.rows - lo]  # [P] entry belongs to an over-full row
    truncated = int((counts > cap).sum())
    if truncated == 0:
        return kept, 0
    cut = cut_rows(Candidates(kept.rows[over], kept.cols[over], kept.sims[over]), x, cap, band)
    rest = ~over
    return Candidates(np.concatenate([kept.rows[rest], cut.rows]),
                      np.concatenate([kept.cols[rest], cut.cols]),
                      np.concatenate([kept.sims[rest], cut.sims])), truncated
