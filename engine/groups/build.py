"""Range search over speech-token embeddings -> Acoustic Similarity Groups.

`G(t) = { t' : cos(e_t, e_t') >= theta }`, every token in its own group. The torch backend
computes cosines block by block (a matmul per block of query rows against the whole table), on
whatever device the tensors live.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from engine.groups.csr import SpeechGroups


def check_theta(theta: float) -> float:
    if not isinstance(theta, (int, float)) or not 0.0 < float(theta) <= 1.0:
        raise ValueError(f"theta must lie in (0, 1] (a cosine threshold); got {theta!r}")
    return float(theta)


def normalise(embeddings: torch.Tensor) -> torch.Tensor:
    """L2-normalised float32 rows."""
    x = embeddings.float()
    norms = x.norm(dim=-1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("an embedding row is all zeros: its cosine similarity is undefined")
    return x / norms


def pairs_to_csr(rows: np.ndarray, cols: np.ndarray, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, de-duplicated (row, col) pairs -> (indptr, members)."""
    keys = np.unique(rows.astype(np.int64) * num_tokens + cols.astype(np.int64))
    r, c = np.divmod(keys, num_tokens)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=num_tokens))]).astype(np.int64)
    return indptr, c


def range_search_torch(
    embeddings: torch.Tensor,
    theta: float,
    max_group_size: int | None = None,
    block: int = 1024,
    progress: bool = False,
    query_rows: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Pairs `(query, member)` with cosine >= theta, for query rows `query_rows` (all by default).

    With `max_group_size`, each query keeps its `max_group_size` most similar members (itself
    always among them) and groups that had more are counted as truncated.

    Returns:
        (query ids, member ids, number of truncated groups).
    """
    theta = check_theta(theta)
    x = normalise(embeddings)
    n = x.shape[0]
    lo, hi = query_rows or (0, n)
    rows, cols, truncated = [], [], 0
    starts = range(lo, hi, block)
    for start in tqdm(starts, desc="range search", disable=not progress, unit="block"):
        stop = min(start + block, hi)
        sims = x[start:stop] @ x.T  # [blk, V]
        local = torch.arange(stop - start, device=x.device)
        sims[local, local + start] = 2.0  # a token is always in its own group
        hit = sims >= theta
        if max_group_size is not None:
            counts = hit.sum(-1)
            truncated += int((counts > max_group_size).sum())
            k = min(max_group_size, n)
            vals, idx = torch.topk(sims, k, dim=-1)
            keep = vals >= theta
            r = local[:, None].expand_as(idx)[keep] + start
            c = idx[keep]
        else:
            r, c = hit.nonzero(as_tuple=True)
            r = r + start
        rows.append(r.cpu().numpy())
        cols.append(c.cpu().numpy())
    return np.concatenate(rows), np.concatenate(cols), truncated


def build_groups(
    embeddings: torch.Tensor,
    theta: float,
    max_group_size: int | None = None,
    block: int = 1024,
    progress: bool = False,
) -> SpeechGroups:
    """Groups for every row of `embeddings` `[V, D]`.

    Without a cap the pair set is symmetrised (union with its transpose), so blockwise rounding
    at the threshold cannot make `t' in G(t)` and `t not in G(t')` disagree. With a cap groups
    may be asymmetric; the decoding index then uses the transpose for S(t).
    """
    rows, cols, truncated = range_search_torch(embeddings, theta, max_group_size, block, progress)
    n = embeddings.shape[0]
    if max_group_size is None:
        rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])
    indptr, members = pairs_to_csr(rows, cols, n)
    dtype = np.uint16 if n <= 65536 else np.int32
    return SpeechGroups(indptr=indptr, members=members.astype(dtype), theta=theta, num_tokens=n,
                        max_group_size=max_group_size, truncated=truncated)
