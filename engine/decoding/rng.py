"""Counter-based random numbers per row: `u = hash(seed, position, purpose, lane)`.

Why counter-based: an item's randomness then depends only on its own seed and the sequence
position of each decision, never on which batch or slot it landed in, and drawing needs no
per-row generator (no Python loop over rows). Reusing a counter is safe: a position is only
redrawn after the decision that used it was discarded (a rejected draft tail), and the event
that discarded it depended only on earlier positions.

The hash is Wellons' `lowbias32` (two xor-shift-multiply rounds) on 32-bit words held in int64;
both multipliers are below 2**31, so no product overflows int64.
"""

from __future__ import annotations

import torch

VERSION = 1  # of the draws (a change of the hash is a change of every sampled row's codes)
MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9

# Purposes: one independent stream per kind of decision.
DRAFT = 1  # draft token sampling
ACCEPT = 2  # accept/reject uniform
LABEL = 3  # PCG group label of a draft token
BONUS = 4  # token after an all-accepted block, and every `ar` token
RECOVER = 5  # token drawn from the residual on rejection (lane = trial)
RECOVER_LABEL = 6  # PCG thinning: group label of the trial token
RECOVER_ACCEPT = 7  # PCG thinning: accept the trial
FALLBACK_GROUP = 8  # PCG exact fallback: group from the dense residual
FALLBACK_TOKEN = 9  # PCG exact fallback: token inside the group


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Avalanche a 32-bit word (int64 tensor with values in [0, 2**32))."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def seed_key(seed: torch.Tensor) -> torch.Tensor:
    """The hash state after a row's seed (its two 32-bit halves), the part of every draw that
    depends on the seed alone: a decoder computes it once per row and draws with
    `keyed_uniform`, two of the six mixing rounds fewer per draw."""
    seed = seed.long()
    h = mix32((seed & MASK32) ^ GOLDEN)
    return mix32(h ^ ((seed >> 32) & MASK32))


def keyed_uniform(
    key: torch.Tensor, position: torch.Tensor, purpose: int, lane: torch.Tensor | int = 0
) -> torch.Tensor:
    """`uniform` from a row's `seed_key` (the same numbers). A Python int `lane` stays on the
    host: no tensor is made for it (on CUDA that would be a copy to the device, and a wait for
    it, per draw)."""
    return draw(key, position, stream_word(purpose, lane if isinstance(lane, int) else lane.long()))


def stream_word(purpose: int, lane: torch.Tensor | int = 0) -> torch.Tensor | int:
    """The hash word of (purpose, lane): `draw(key, pos, words)` with a tensor of such words
    draws several purposes and lanes in one evaluation, the same numbers as one call each (a
    decoder draws a whole round's uniforms at once: one evaluation per round)."""
    return (purpose * 0x10001 + lane) & MASK32


def draw(key: torch.Tensor, position: torch.Tensor, words: torch.Tensor | int) -> torch.Tensor:
    """`keyed_uniform` for streams given by their `stream_word`s (broadcasting with `position`)."""
    h = mix32(key ^ (position.long() & MASK32))
    h = mix32(h ^ words)
    hi, lo = mix32(torch.stack([h ^ 0x68E31DA4, h ^ 0x1B56C4E9]))  # both words in one pass
    return ((hi >> 5) * 67108864 + (lo >> 6)).double() / 9007199254740992.0


def uniform(
    seed: torch.Tensor, position: torch.Tensor, purpose: int, lane: torch.Tensor | int = 0
) -> torch.Tensor:
    """float64 uniforms in [0, 1) with 53 random bits, broadcast over the inputs' shapes.

    Args:
        seed: per-row seeds (int64), e.g. `[B, 1]`.
        position: sequence position of the decision, broadcastable with `seed`.
        purpose: which decision (module constants).
        lane: extra index, e.g. the thinning trial.
    """
    return keyed_uniform(seed_key(seed), position, purpose, lane)
