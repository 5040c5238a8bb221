"""Logits -> warped float32 probabilities, and categorical draws from given uniforms.

Draft and target go through the same `warp` with the same settings and the same token history,
so every acceptance rule compares like with like.
"""

from __future__ import annotations

import torch

from engine.config import Warp


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """CTRL-style penalty on tokens already in the sequence: divide positive logits, multiply
    negative ones (what transformers does)."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def penalised_logits(logits: torch.Tensor, seen: torch.Tensor, warp: Warp) -> torch.Tensor:
    """float32 logits after the repetition penalty (the greedy path stops here)."""
    return apply_repetition_penalty(logits.float(), seen, warp.repetition_penalty)


def warp_probs(logits: torch.Tensor, seen: torch.Tensor, warp: Warp) -> torch.Tensor:
    """Warped float32 probabilities `[..., V]`.

    Args:
        logits: `[..., V]` raw logits.
        seen: `[..., V]` bool, tokens present in the sequence so far (repetition penalty).
        warp: settings; must not be greedy.
    """
    x = penalised_logits(logits, seen, warp) / warp.temperature
    if warp.top_k > 0 and warp.top_k < x.shape[-1]:
        kth = torch.topk(x, warp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if warp.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = mass_before >= warp.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: `probs` `[..., V]` (need not sum to 1), `u` `[..., n]` float64 in [0,1).

    Returns `[..., n]` indices; a zero-probability index is never returned.
    """
    cdf = probs.double().cumsum(-1)  # [..., V]
    target = u * cdf[..., -1:]
    idx = torch.searchsorted(cdf, target, right=True)
    return idx.clamp_(max=probs.shape[-1] - 1)


def sample_one(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row: `probs` `[..., V]`, `u` `[...]` -> `[...]`."""
    return sample_from(probs, u[..., None])[..., 0]
