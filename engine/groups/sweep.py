"""Group sizes at several thresholds from one search: for choosing theta (docs/pcg.md section 2: 0.38-0.45
was best on LLaSA-8B; the right point depends on the target's embeddings)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.groups.build import (
    EXACT_BAND,
    check_ranges,
    check_theta,
    member_dtype,
    slice_bounds,
    threshold,
    unit_rows,
)
from engine.groups.search import make_range_searcher
from engine.models.device import resolve_device


def parse_thetas(text: str) -> list[float]:
    """`"0.35,0.40,0.45"` -> `[0.35, 0.4, 0.45]`, each checked to lie in (0, 1]."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError("thetas must be comma-separated numbers, e.g. 0.35,0.40,0.45; "
                         f"got {text!r}") from None
    if not values:
        raise ValueError("give at least one theta")
    return [check_theta(v) for v in values]


def size_summary(theta: float, sizes: np.ndarray) -> dict:
    """Per-theta figures: mean/median/max group size, singletons, coverage, CSR bytes."""
    n, nnz = len(sizes), int(sizes.sum())
    singletons = int((sizes == 1).sum())
    return {"theta": theta, "mean_size": round(float(sizes.mean()), 4),
            "median_size": float(np.median(sizes)), "max_size": int(sizes.max()),
            "singletons": singletons, "coverage": round(1.0 - singletons / n, 6), "nnz": nnz,
            "csr_bytes": nnz * member_dtype(n).itemsize + (n + 1) * 8}


def sweep(embeddings: torch.Tensor | np.ndarray, thetas: list[float], backend: str = "auto",
          device: str | torch.device | None = None, progress: bool = False,
          ranges: Sequence[tuple[int, int]] | None = None) -> list[dict]:
    """Uncapped group sizes `|G(t)|` at every theta, searching once at the lowest.

    Sizes equal those of `build_groups` at the same theta and code `ranges` (same exact decisions).

    Returns:
        One `size_summary` dict per theta, in the order given.
    """
    thetas = [check_theta(t) for t in thetas]
    x = unit_rows(embeddings)
    ranges = check_ranges(ranges, x.shape[0])
    searcher = make_range_searcher(x, ranges, backend, resolve_device(device))
    sizes = {t: np.zeros(x.shape[0], dtype=np.int64) for t in thetas}
    floor = min(thetas) - EXACT_BAND
    bounds = slice_bounds(x.shape[0], ranges=ranges)
    for lo, hi in tqdm(bounds, desc="sweep", unit="slice", disable=bar_disabled(progress)):
        cand = searcher(lo, hi, floor)
        for theta in thetas:
            kept = threshold(x, cand, lo, hi, theta)
            sizes[theta][lo:hi] = np.bincount(kept.rows - lo, minlength=hi - lo)
    return [size_summary(t, sizes[t]) for t in thetas]


def format_sweep(rows: list[dict]) -> str:
    head = f"{'theta':>6s} {'mean size':>10s} {'median':>7s} {'max':>6s} {'singletons':>10s} " \
           f"{'coverage':>9s} {'CSR MiB':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['theta']:6.3f} {r['mean_size']:10.2f} {r['median_size']:7g} {r['max_size']:6d} "
                     f"{r['singletons']:10d} {r['coverage']:9.4f} {r['csr_bytes'] / 2**20:8.2f}")
    return "\n".join(lines)
