"""Logits -> warped float32 probabilities, and categorical draws from given uniforms.

Draft and target go through the same warp with the same settings and the same token history,
so every acceptance rule compares like with like. Settings are per row (`RowWarp`: one batch
may mix temperatures, top-k, top-p, penalties, greedy and sampled rows); every operation is
row-wise and a row whose knob is off is left exactly as it would be alone, so a row's
probabilities never depend on the other rows of its batch. `Warp` (one setting for every row)
is accepted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, make_dataclass

import numpy as np
import torch

from engine.knobs import WARP_KNOBS, SamplingSteps, Warp
from engine.models.llama import wide
from engine.models.ops import opaque_op

# The `[b]` per-row sampling tensors: one column per warp knob (`Knob.column`, of `Knob.dtype`) and
# `greedy` (bool: temperature 0). A decoder's state holds them (`RoundState.sampling`).
COLUMNS: tuple[str, ...] = (*(k.column for k in WARP_KNOBS), "greedy")
WarpColumns = make_dataclass("WarpColumns", [(name, torch.Tensor) for name in COLUMNS], eq=False,
                             namespace={"__module__": __name__})


def free_columns(b: int, device: torch.device | str = "cpu") -> WarpColumns:
    """The columns of `b` free slots: every knob off, no row greedy."""
    knobs = {k.column: torch.full((b,), k.off, dtype=getattr(torch, k.dtype), device=device) for k in WARP_KNOBS}
    return WarpColumns(**knobs, greedy=torch.zeros(b, dtype=torch.bool, device=device))


def columns_of(warps: Sequence[Warp], device: torch.device | str = "cpu", vocab: int | None = None) -> WarpColumns:
    """The columns of one row per `Warp`: each knob's value as a round uses it (`Knob.host_value`;
    `vocab`: the output vocabulary's size), a greedy row's placeholder (`Knob.greedy_as`) instead."""
    greedy = np.array([w.greedy for w in warps], dtype=bool)
    knobs = {}
    for k in WARP_KNOBS:
        values = np.array([k.host_value(getattr(w, k.name), vocab) for w in warps],
                          dtype=np.float64 if k.type is float else np.int64)
        if k.greedy_as is not None:
            values = np.where(greedy, k.greedy_as, values)
        knobs[k.column] = torch.as_tensor(values, dtype=getattr(torch, k.dtype)).to(device)
    return WarpColumns(**knobs, greedy=torch.as_tensor(greedy, dtype=torch.bool).to(device))


def write_rows(columns: WarpColumns, rows: torch.Tensor, values: WarpColumns) -> None:
    """`values`' rows written into `columns` at `rows`, in place (a captured graph reads these very
    tensors)."""
    for name in COLUMNS:
        getattr(columns, name)[rows] = getattr(values, name)


@dataclass(eq=False)
class RowWarp(WarpColumns):
    """Sampling settings of `b` rows: device tensors for the maths, and the steps that run at all
    (host values: choosing costs no device sync).

    Attributes:
        temperature, top_p, top_k, penalty, ...: `[b]` one column per warp knob (`COLUMNS`), each
            `Knob.off` where off; greedy rows' temperature is 1 (a placeholder: their decisions
            are argmaxes).
        greedy: `[b]` bool, temperature 0.
        steps: the steps some row needs (`SamplingSteps`); a row whose knob is off is left as
            it is by its step.
    """

    steps: SamplingSteps

    @classmethod
    def over(cls, columns: WarpColumns, steps: SamplingSteps) -> RowWarp:
        """The rows of `columns` under `steps`."""
        return cls(*(getattr(columns, name) for name in COLUMNS), steps)

    @classmethod
    def of(cls, warps: Sequence[Warp], device: torch.device | str = "cpu") -> RowWarp:
        """One row per `Warp`."""
        return cls.over(columns_of(warps, device), SamplingSteps.of(warps))

    def view(self, x: torch.Tensor) -> tuple[int, ...]:
        """Shape that broadcasts a `[b]` setting over `x` `[b, ..., V]`."""
        return (-1,) + (1,) * (x.dim() - 1)


def divide_rows(x: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
    """`x / by` with `by` broadcast per row, rounded as a division by a Python float would be
    on this device (CUDA multiplies by the float32 reciprocal of a scalar divisor; the CPU
    divides), so uniform settings give the bits they gave before per-row settings."""
    if x.is_cuda:
        return x * (1.0 / by)
    if torch.compiler.is_compiling():
        # a divisor of the full shape (a view: the same divisions) keeps inductor from rewriting a
        # softmax that follows as one over the undivided logits with a second division and a
        # non-finite check per element (slower on a CPU)
        by = by.expand_as(x)
    wide_dtype = torch.promote_types(x.dtype, by.dtype)
    if x.dtype == wide_dtype:
        return x / by
    # widened first, then divided in place: a CPU divides mixed dtypes element by element, and two
    # vectorised passes take less time (the same bits: widening is exact)
    return x.to(wide_dtype).div_(by)


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float | torch.Tensor
) -> torch.Tensor:
    """CTRL-style penalty on tokens already in the sequence: divide positive logits, multiply
    negative ones (what transformers does). `penalty` is a float or `[b]` per row (1 = off)."""
    if not torch.is_tensor(penalty):
        if penalty == 1.0:
            return logits
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        return torch.where(seen, penalised, logits)
    p = penalty.view((-1,) + (1,) * (logits.dim() - 1))
    penalised = torch.where(logits > 0, divide_rows(logits, p), logits * p)
    return torch.where(seen & (p != 1.0), penalised, logits)


def penalised_logits(logits: torch.Tensor, seen: torch.Tensor, warp: Warp | RowWarp) -> torch.Tensor:
    """float32 logits after the repetition penalty (the greedy path stops here). Per-row
    settings without a penalty leave the logits as they are: `warp_penalised` widens them in its
    first op (the temperature's division, in float32), and an argmax is the same in either dtype."""
    if isinstance(warp, Warp):
        return apply_repetition_penalty(wide(logits), seen, warp.repetition_penalty)
    if not warp.steps.penalty:
        return logits
    return apply_repetition_penalty(wide(logits), seen, warp.penalty)


def warp_penalised(x: torch.Tensor, warp: Warp | RowWarp) -> torch.Tensor:
    """Penalised logits `[b, ..., V]` -> float32 probabilities: temperature, top-k, top-p.
    Rows that are greedy get temperature-1 probabilities (never used for a decision)."""
    if isinstance(warp, Warp):
        return _warp_uniform(wide(x), warp)
    shape = warp.view(x)
    x = divide_rows(x, warp.temperature.view(shape))  # float32 (or float64) from here on
    if warp.steps.max_top_k > 0:
        # each row's k-th largest value, from one top-k at the largest k in use
        width = min(warp.steps.max_top_k, x.shape[-1])
        values = torch.topk(x, width, dim=-1).values
        k = warp.top_k.clamp(1, width).view(shape).expand(*x.shape[:-1], 1)
        kth = values.gather(-1, k - 1)
        on = ((warp.top_k > 0) & (warp.top_k < x.shape[-1]) & ~warp.greedy).view(shape)
        x = x.masked_fill(on & (x < kth), float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if warp.steps.top_p:
        top_p = warp.top_p.view(shape)
        off = (top_p >= 1.0) | warp.greedy.view(shape)
        # rows at top_p == 1 keep their probabilities as they are (no renormalising)
        probs = nucleus(probs, top_p, skip=off.expand(*probs.shape[:-1], 1))
    return probs


NUCLEUS_HEADS = (1024, 8192)  # the heads tried before a full sort (see `nucleus`)


def nucleus(probs: torch.Tensor, top_p: torch.Tensor | float, skip: torch.Tensor | None = None) -> torch.Tensor:
    """Keep the smallest prefix (by probability) whose mass reaches `top_p`, renormalised;
    the most likely token always stays. Where tokens of equal probability straddle the prefix's
    edge, the lowest token ids stay (the prefix of a stable descending sort: `nucleus_sorted`).
    `top_p`: a float or per-row values broadcasting with `probs[..., :1]`; `skip` (the same
    shape, bool): rows returned as they are.

    On a CPU a row is first tried on its most likely tokens only (`NUCLEUS_HEADS`: a top-k of
    1,024, then of 8,192): where its nucleus ends inside that head, the head's values and float32
    running sums are the sort's own first ones, so the edge and its value `v` are the sort's, and
    the kept tokens are those above `v` and the lowest ids of those at `v`: token for token the
    sort's. A row whose edge lies beyond the largest head is sorted whole. On a CPU a top-k of
    1,024 costs far less than a sort of the whole vocabulary, so most rows never sort. A
    compiled round calls the same code as one opaque op (`pcg_synth::nucleus_keep`), its choices
    made on the host. On CUDA rows are sorted: choosing there would wait for the device inside a
    round."""
    if probs.device.type != "cpu":
        out = nucleus_sorted(probs, top_p)
        return out if skip is None else torch.where(skip, probs, out)
    vocab = probs.shape[-1]
    flat = probs.reshape(-1, vocab)
    limit = torch.as_tensor(top_p, dtype=probs.dtype).expand(*probs.shape[:-1], 1).reshape(-1, 1)
    if torch.compiler.is_compiling():
        keep = torch.ops.pcg_synth.nucleus_keep(flat, limit, None if skip is None else skip.reshape(-1, 1))
    else:
        keep = nucleus_keep(flat, limit, skip)
    kept = flat.masked_fill(~keep, 0.0)
    out = (kept / kept.sum(-1, keepdim=True)).view(probs.shape)
    return out if skip is None else torch.where(skip, probs, out)


def nucleus_keep(flat: torch.Tensor, limit: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
    """`nucleus`'s kept tokens `[n, V]` (bool) of `flat` `[n, V]`, `limit` `[n, 1]`, on a CPU: each
    row through the smallest head that holds its edge, rows in `skip` not at all (all kept)."""
    keep = torch.ones_like(flat, dtype=torch.bool)
    pending = torch.arange(flat.shape[0]) if skip is None else (~skip).reshape(-1).nonzero()[:, 0]
    for k in NUCLEUS_HEADS:
        if k >= flat.shape[-1] or not len(pending):
            break
        rows = flat if len(pending) == len(flat) else flat[pending]
        head = torch.topk(rows, k, dim=-1).values
        drop = head.cumsum(-1) - head >= limit[pending]  # as `nucleus_sorted`, on the head
        inside = drop[:, -1]  # the edge lies inside the head
        if inside.any():
            keep[pending[inside]] = _head_keep(rows[inside], head[inside], drop[inside])
            pending = pending[~inside]
    if len(pending):
        rows = flat if len(pending) == len(flat) else flat[pending]
        keep[pending] = nucleus_sorted(rows, limit[pending], mask=True)
    return keep


# a compiled round calls `nucleus_keep` as it is: its per-row choices read values on the host
opaque_op("nucleus_keep", "(Tensor flat, Tensor limit, Tensor? skip) -> Tensor", nucleus_keep,
          lambda flat, limit, skip: flat.new_empty(flat.shape, dtype=torch.bool))


def _head_keep(rows: torch.Tensor, head: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Kept tokens of `rows` `[n, V]` whose nucleus edge lies inside `head` `[n, k]` (their `k`
    largest values, descending; `drop` `[n, k]` marks the head's tokens past the edge)."""
    edge = (~drop).sum(-1, keepdim=True).clamp(min=1)  # [n, 1] tokens kept
    v = head.gather(-1, edge - 1)  # the last kept value
    at_v = edge - (head > v).sum(-1, keepdim=True)  # tokens of value v kept
    equal = rows == v
    return (rows > v) | (equal & (equal.cumsum(-1, dtype=torch.int32) <= at_v))


def nucleus_sorted(probs: torch.Tensor, top_p: torch.Tensor | float, mask: bool = False) -> torch.Tensor:
    """`nucleus` by a stable descending sort of the whole vocabulary (`mask`: the kept tokens,
    bool)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    if mask:
        return ~drop
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def _warp_uniform(x: torch.Tensor, warp: Warp) -> torch.Tensor:
    x = x / warp.temperature
    if warp.top_k > 0 and warp.top_k < x.shape[-1]:
        kth = torch.topk(x, warp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if warp.top_p < 1.0:
        probs = nucleus(probs, warp.top_p)
    return probs


def warp_probs(logits: torch.Tensor, seen: torch.Tensor, warp: Warp | RowWarp) -> torch.Tensor:
    """Warped float32 probabilities `[..., V]`.

    Args:
        logits: `[b, ..., V]` raw logits.
        seen: `[b, ..., V]` bool, tokens present in the sequence so far (repetition penalty).
        warp: one setting for all rows (must not be greedy), or per-row settings.
    """
    return warp_penalised(penalised_logits(logits, seen, warp), warp)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: `probs` `[..., V]` (need not sum to 1), `u` `[..., n]` float64 in [0,1).

    Returns `[..., n]` indices: the first index whose cumulative mass exceeds `u` times the
    total (accumulated in float64, in place in the float64 copy: the same sums as
    `cumsum(dtype=float64)`, which allocates its output besides the copy it makes); a
    zero-probability index is never returned. A graph compiled for a CPU draws through
    `sample_blocked` instead (the same law, the sums in another order).
    """
    if torch.compiler.is_compiling() and probs.device.type == "cpu":
        return sample_blocked(probs, u)
    cdf = probs.to(torch.float64, copy=True).cumsum_(-1)  # [..., V] (a copy even of float64 probs)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return idx.clamp_(max=probs.shape[-1] - 1)


DRAW_BLOCK = 256  # tokens per block of `sample_blocked`


def sample_blocked(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample_from`'s draws with the cumulative mass taken in two levels: float64 sums of blocks
    of `DRAW_BLOCK` tokens, a cumulative sum over the blocks, then one inside the chosen block.

    The same law as `sample_from` (inverse-CDF draws with float64 sums; only the order of the
    additions differs, so a draw can differ where `u` lies within float64 rounding, ~1e-16, of a
    token's edge), without the float64 copy of the vocabulary and its cumulative sum, a serial
    chain of additions per row (inductor has no CPU scan). A compiled round on a CPU draws so: the
    block sums fuse into the kernel that makes the probabilities. A zero-probability token is
    never returned: the block and the token inside it are capped at the last with mass."""
    v, width = probs.shape[-1], DRAW_BLOCK
    full, lead = v // width, probs.shape[:-1]
    # whole blocks as a view, the partial last one apart (padding would mask every load)
    sums = probs[..., :full * width].reshape(*lead, full, width).sum(-1, dtype=torch.float64)
    if full * width < v:
        sums = torch.cat([sums, probs[..., full * width:].sum(-1, keepdim=True, dtype=torch.float64)], -1)
    incl = sums.cumsum(-1)  # [..., blocks] mass through each block
    t = u * incl[..., -1:]  # [..., n]
    ids = torch.arange(incl.shape[-1], device=probs.device)
    last_block = torch.where(sums > 0, ids, 0).amax(-1, keepdim=True)
    b = torch.searchsorted(incl, t, right=True).minimum(last_block)  # [..., n]
    before = torch.where(b > 0, incl.gather(-1, (b - 1).clamp(min=0)), 0.0)  # mass before block b
    idx = b[..., None] * width + torch.arange(width, device=probs.device)  # [..., n, width]
    chosen = probs.gather(-1, idx.clamp(max=v - 1).flatten(-2)).view(idx.shape).masked_fill(idx >= v, 0.0)
    within = chosen.to(torch.float64).cumsum(-1).add_(before[..., None])
    j = torch.searchsorted(within, t[..., None], right=True)[..., 0]  # [..., n]
    last = torch.where(chosen > 0, torch.arange(width, device=probs.device), 0).amax(-1)
    return b * width + j.minimum(last)  # a token with mass, so inside the vocabulary


def sample_one(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row: `probs` `[..., V]`, `u` `[...]` -> `[...]`."""
    return sample_from(probs, u[..., None])[..., 0]
