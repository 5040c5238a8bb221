"""What a group build accepts, checked without torch: the command line validates its arguments
with these before any model or embedding table loads (`engine.groups.build`, `.search` and
`.source` use the same names and checks)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

BACKENDS = ("auto", "faiss", "torch")
SOURCES = ("input_embeddings", "lm_head")


@dataclass(frozen=True)
class GroupsBuild:
    """One groups request: what the groups are and how a build makes them.

    `theta`, `max_group_size`, `dedup`, `ranges` and `family` decide the groups (they are the
    cache key, with the rows' hash); `source` is recorded only; `backend`, `workers`, `device`
    and `progress` change how a build runs, never its result, so they stay out of the key.
    Values are checked where they are used (`check_theta`, `check_cap`, `check_ranges`).

    Attributes:
        theta: cosine threshold in (0, 1].
        max_group_size: optional cap (truncated groups are counted); None: no cap.
        dedup: store identical groups once (changes N(t); docs/pcg.md section 2).
        ranges: code ranges as `(first row, size)` pairs a group never mixes; None: one range.
        family: the target's model family (`SpeechLayout.family`); None for bare rows.
        source: which table the rows came from (`SOURCES`).
        backend: `auto` | `faiss` | `torch` (`BACKENDS`).
        workers: 0 builds in this process; N >= 1 uses N Ray workers (in
            `build_groups_distributed`, 0 or None: one per GPU, else per CPU slot).
        device: where a single-process build searches (None or `auto`: CUDA where available).
        progress: progress bar while building.
    """

    theta: float
    max_group_size: int | None = None
    dedup: bool = False
    ranges: Sequence[tuple[int, int]] | None = None
    family: str | None = None
    source: str = "input_embeddings"
    backend: str = "auto"
    workers: int | None = 0
    device: str | None = None
    progress: bool = False


def check_theta(theta: float) -> float:
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not 0.0 < float(theta) <= 1.0:
        raise ValueError(f"theta must lie in (0, 1] (a cosine threshold); got {theta!r}")
    return float(theta)


def check_cap(max_group_size: int | None) -> int | None:
    if max_group_size is None:
        return None
    if isinstance(max_group_size, bool) or not isinstance(max_group_size, numbers.Integral) \
            or max_group_size < 1:
        raise ValueError(f"max_group_size must be a positive integer or None; got {max_group_size!r}")
    return int(max_group_size)


def check_ranges(ranges: Sequence[tuple[int, int]] | None, num_tokens: int) -> list[tuple[int, int]]:
    """Code ranges as `(first row, size)` pairs that tile `0..num_tokens-1` contiguously, in order
    (None: one range over every row). A group never mixes ranges.

    Raises:
        ValueError: an empty list, a size below 1, a gap, an overlap, or a total other than
            `num_tokens`.
    """
    if ranges is None:
        return [(0, num_tokens)]
    out, end = [], 0
    for item in ranges:
        try:
            start, size = item
        except (TypeError, ValueError):
            raise ValueError(f"each code range must be a (start, size) pair; got {item!r}") from None
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in (start, size)):
            raise ValueError(f"code range starts and sizes must be integers; got {item!r}")
        if start != end or size < 1:
            raise ValueError(f"code ranges must tile 0..{num_tokens - 1} contiguously, in order, each at "
                             f"least one row; range {len(out)} is ({start}, {size}), expected to start at {end}")
        out.append((int(start), int(size)))
        end += int(size)
    if not out or end != num_tokens:
        raise ValueError(f"code ranges must tile 0..{num_tokens - 1} contiguously, in order; they cover "
                         f"{end} rows" + ("" if out else " (no range given)"))
    return out


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """`"7x4096"` or `"4096,4096,8192"` (sizes in order, `COUNTxSIZE` repeats one) ->
    `[(0, 4096), (4096, 4096), ...]`; `check_ranges` then holds them to the table's rows.

    Raises:
        ValueError: not sizes.
    """
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        count, size = part.split("x", 1) if "x" in part else ("1", part)
        try:
            count_n, size_n = int(count), int(size)
        except ValueError:
            count_n = size_n = 0
        if count_n < 1 or size_n < 1:
            raise ValueError(f"ranges must be positive sizes in order, e.g. 7x4096 or 4096,8192; got {text!r}")
        sizes += [size_n] * count_n
    return list(zip(accumulate(sizes, initial=0), sizes))
