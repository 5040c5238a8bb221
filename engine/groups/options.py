"""What a group build accepts, checked without torch: the command line validates its arguments
with these before any model or embedding table loads (`engine.groups.build`, `.search` and
`.source` use the same names and checks)."""

from __future__ import annotations

import numbers

BACKENDS = ("auto", "faiss", "torch")
SOURCES = ("input_embeddings", "lm_head")


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
