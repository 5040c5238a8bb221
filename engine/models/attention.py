"""Attention of a step's queries over the cached keys and values, by one of three paths
(`attend`): torch's SDPA (`sdpa`), SDPA with each KV head's query heads folded into its query
positions (`folded`: faster on a CPU where `fold_pays`), and masked grouped-query attention in
plain ops (`grouped`: CUDA's, where torch's SDPA goes to cuDNN, which keeps a graph per shape).
`tests/cpu/test_llama_parity.py` pins each against torch's SDPA and transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUPED_SCORES_BYTES = 256 * 2**20  # float32 scores one `grouped_attention` call holds at once


def wide(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32, or float64 when it already is: the precision the numerics run in (float32,
    as transformers does, for float32/bfloat16/float16 models; a float64 model stays exact end to
    end, which is what bit-for-bit comparisons of two code paths rely on)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)` in
    plain torch ops, scores and softmax in float32: q `[b, H, T, D]`, keys/values `[b, H_kv, L,
    D]` (query head h reads KV head h // (H / H_kv)), mask `[b, 1, T, L]` bool (True = attend).

    Why on CUDA: torch dispatches masked grouped-query attention to cuDNN's kernel on Hopper
    GPUs, and caches a cuDNN graph per shape, while a decode loop's key length grows every round
    and every prompt length is new: each call costs host time several matrix products long.
    These few ops set
    nothing up per shape, and the query heads of a KV head share one batched product (the keys are
    not repeated per query head). Rows are taken in chunks whose scores fit
    `GROUPED_SCORES_BYTES`, one row at a time where even one row's do not
    (long prefills of many rows)."""
    b, heads, t, d = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    qg = wide(q.reshape(b, kv_heads, group * t, d)) * d ** -0.5  # rows of one KV head together
    attend = mask[:, :, None]  # [b, 1, 1, T, L] against scores [b, H_kv, group, T, L]

    def rows(qs, ks, vs, att):
        scores = torch.matmul(qs, wide(ks).transpose(-1, -2))  # [n, H_kv, group * T, L]
        n = scores.shape[0]
        scores = torch.where(att, scores.view(n, kv_heads, group, t, length), float("-inf"))
        return torch.matmul(scores.softmax(-1).view(n, kv_heads, group * t, length), wide(vs))

    chunk = b if torch.compiler.is_compiling() else max(1, GROUPED_SCORES_BYTES // (heads * t * length * 4))
    if chunk >= b:  # a decode step's rows: one pass (and the only one inside a compiled graph)
        out = rows(qg, keys, values, attend)
    else:
        out = torch.cat([rows(qg[i:i + chunk], keys[i:i + chunk], values[i:i + chunk], attend[i:i + chunk])
                         for i in range(0, b, chunk)])
    return out.to(q.dtype).view(b, heads, t, d)


def fold_pays(dtype: torch.dtype, positions: int) -> bool:
    """Whether a CPU step folds its attention (`folded_attention`): in bfloat16 and float16 always (at
    one position torch's kernel is several times slower unfolded), in float32 and float64 from two
    positions on (at one their kernel is as fast unfolded or faster; docs/performance.md)."""
    return positions > 1 or dtype in (torch.bfloat16, torch.float16)


def fold_mask(mask: torch.Tensor, group: int) -> torch.Tensor:
    """A mask `[b, 1, T, L]` in `folded_attention`'s layout `[b, 1, group * T, L]` (a step folds
    it once for all its layers)."""
    b, _, t, length = mask.shape
    return mask.repeat(1, 1, group, 1) if t > 1 else mask.expand(b, 1, group, length)


def folded_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)` with each
    KV head's query heads folded into its query positions: q `[b, H, T, D]`, keys/values `[b, H_kv,
    L, D]`, mask `[b, 1, T, L]` bool (True = attend) -> `[b, H, T, D]`. The same kernel and per-query
    maths, the work split another way: the outputs are SDPA's bit for bit in most shapes and within
    a last bit in the others. A model's step decides
    whether to fold (`LlamaLM.attention_kind`, `fold_pays`) and folds the mask once for all its
    layers (`fold_mask`, `_folded`)."""
    b, heads, t, d = q.shape
    return _folded(q, keys, values, fold_mask(mask, heads // keys.shape[1])).view(b, heads, t, d)


def _folded(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, folded_mask: torch.Tensor) -> torch.Tensor:
    """SDPA of q `[b, H, T, D]` folded to `[b, H_kv, group * T, D]` (query head h is KV head
    h // group; then its positions), under a folded mask: the output in that layout."""
    b, heads, t, d = q.shape
    kv_heads = keys.shape[1]
    folded = q.reshape(b, kv_heads, heads // kv_heads * t, d)
    return F.scaled_dot_product_attention(folded, keys, values, attn_mask=folded_mask)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           kind: str = "sdpa") -> torch.Tensor:
    """Attention of q `[b, H, T, D]` over keys/values `[b, H_kv, L, D]` under `mask` by the path
    `kind`: `grouped` (`grouped_attention`), `folded` (`_folded`, the mask folded beforehand:
    `fold_mask`) or `sdpa` (torch's). The output is `[b, H, T, D]`, except
    that `folded` at one position keeps its folded layout `[b, H_kv, group, D]`: at T = 1 that is
    the heads' order already, so a caller reshapes it as it would the heads."""
    if kind == "folded":
        b, heads, t, d = q.shape
        out = _folded(q, keys, values, mask)  # [b, H_kv, group * T, D]
        return out.view(b, heads, t, d) if t > 1 else out
    if kind == "grouped":
        return grouped_attention(q, keys, values, mask)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=keys.shape[1] < q.shape[1])
