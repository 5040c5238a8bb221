"""Counter-based random numbers per row: `u = hash(seed, position, purpose, lane)`.

Why counter-based: an item's randomness then depends only on its own seed and the sequence
position of each decision, never on which batch or slot it landed in, and drawing needs no
per-row generator (no Python loop over rows, nothing a captured graph could not replay). Reusing
a counter is safe: a position is only redrawn after the decision that used it was discarded (a
rejected draft tail), and the event that discarded it depended only on earlier positions.

The hash is MurmurHash3's 64-bit finaliser (`fmix64`) on int64 words whose products wrap modulo
2**64 as unsigned arithmetic does (two's complement: the same bits); right shifts are masked, so
they act as logical ones. A draw is about twenty elementwise integer ops, and a decoder draws a
whole round's uniforms in one evaluation (`stream_word`, `draw`). `reference_uniform` computes
the same numbers in Python's integers: the tests pin the tensors against it.
"""

from __future__ import annotations

import torch

VERSION = 2  # of the draws: 2 is fmix64 (1 was two lowbias32 rounds on 32-bit words)
U64 = 1 << 64


def _signed(x: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    x %= U64
    return x - U64 if x >= 1 << 63 else x


MIX1 = _signed(0xFF51AFD7ED558CCD)
MIX2 = _signed(0xC4CEB9FE1A85EC53)
GOLDEN = _signed(0x9E3779B97F4A7C15)  # spreads positions over the word
LANE = _signed(0xD6E8FEB86659FD93)  # spreads purposes and lanes
LOW31 = (1 << 31) - 1  # the bits a logical shift by 33 leaves
LOW53 = (1 << 53) - 1
LANES = 1 << 16  # lanes per purpose: stream (purpose, lane) is purpose * LANES + lane

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


def fmix64(h: torch.Tensor) -> torch.Tensor:
    """Avalanche 64-bit words (int64 tensor; products wrap)."""
    h = h ^ ((h >> 33) & LOW31)
    h = h * MIX1
    h = h ^ ((h >> 33) & LOW31)
    h = h * MIX2
    return h ^ ((h >> 33) & LOW31)


def seed_key(seed: torch.Tensor) -> torch.Tensor:
    """The hash state of a row's seed, the part of every draw that depends on the seed alone:
    a decoder computes it once per row (at admission)."""
    return fmix64(seed.long() ^ GOLDEN)


def stream_word(purpose: int, lane: int = 0) -> int:
    """The word of stream (purpose, lane): `draw(key, position, words)` with a tensor of such
    words draws several purposes and lanes in one evaluation, the same numbers as
    `keyed_uniform` gives one at a time."""
    return _signed((purpose * LANES + lane) * LANE)


def draw(key: torch.Tensor, position: torch.Tensor, word: torch.Tensor | int) -> torch.Tensor:
    """float64 uniforms in [0, 1) with 53 random bits, broadcast over the inputs: a row's
    `seed_key`, the decision's sequence position and its stream's `stream_word`."""
    position = position if position.dtype == torch.long else position.long()
    h = fmix64(key ^ (position * GOLDEN + word))
    return ((h >> 11) & LOW53).double() * 2.0 ** -53


def keyed_uniform(
    key: torch.Tensor, position: torch.Tensor, purpose: int, lane: torch.Tensor | int = 0
) -> torch.Tensor:
    """Uniforms from a row's `seed_key` for one purpose.

    Args:
        key: per-row `seed_key` (int64), e.g. `[B]` or `[B, 1]`.
        position: sequence position of the decision, broadcastable with `key`.
        purpose: which decision (module constants).
        lane: extra index (e.g. the thinning trial): a Python int stays on the host (no tensor
            is made for it: on CUDA that would be a copy to the device per draw), or a tensor.
    """
    word = stream_word(purpose, lane) if isinstance(lane, int) else (lane.long() + purpose * LANES) * LANE
    return draw(key, position, word)


def uniform(
    seed: torch.Tensor, position: torch.Tensor, purpose: int, lane: torch.Tensor | int = 0
) -> torch.Tensor:
    """`keyed_uniform` from the seeds themselves (`[B]` int64, or any shape broadcasting with
    `position`)."""
    return keyed_uniform(seed_key(seed), position, purpose, lane)


def _fmix_int(h: int) -> int:
    h ^= h >> 33
    h = h * (MIX1 % U64) % U64
    h ^= h >> 33
    h = h * (MIX2 % U64) % U64
    return h ^ (h >> 33)


def reference_uniform(seed: int, position: int, purpose: int, lane: int = 0) -> float:
    """The same draw in Python's unbounded integers, modulo 2**64 (for the tests)."""
    key = _fmix_int((seed % U64) ^ (GOLDEN % U64))
    counter = (position * (GOLDEN % U64) + (purpose * LANES + lane) * (LANE % U64)) % U64
    return (_fmix_int(key ^ counter) >> 11) * 2.0 ** -53
