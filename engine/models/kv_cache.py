"""Static KV cache with per-row lengths.

Every row of the batch owns one slot. A forward writes keys and values at the positions it is
given (per row), and attention masks keys by position (`key_pos <= query_pos`), so a row's
"length" is implicit in the positions it queries. Slots that held rejected draft tokens are
simply overwritten by the next forward at those positions; nothing is copied or re-run.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for `num_layers` layers, `batch` slots and `max_len` positions.

    Attributes:
        k, v: per layer, `[B, H_kv, S, D]` keys and values. Each layer's are a tensor of their
            own, not views of one: a compiled round then writes each in place (a write into a
            view of a larger graph input makes the graph copy the whole input back).
        rows: `[B, 1]` every row's index, for writes to all of them.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.rows = torch.arange(batch, device=device)[:, None]

    @property
    def shape(self) -> tuple[int, ...]:
        """`(L, B, H_kv, S, D)`."""
        return (len(self.k), *self.k[0].shape)

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor it holds."""
        return [*self.k, *self.v, self.rows]

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
    ) -> None:
        """Write new keys/values of `slots` at per-row `positions`.

        Args:
            layer: layer index.
            slots: `[b, 1]` cache rows.
            positions: `[b, T]` absolute positions.
            k_new: `[b, T, H_kv, D]`.
            v_new: `[b, T, H_kv, D]`.
        """
        # `slots` [b, 1] broadcasts against positions [b, T]; advanced indices split by a slice
        # put their dims first: the target is [b, T, H_kv, D], the layout of `k_new`.
        self.k[layer][slots, :, positions] = k_new
        self.v[layer][slots, :, positions] = v_new

    def read(
        self, layer: int, slots: torch.Tensor | None, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values `[b, H_kv, kv_len, D]` of `slots` (all rows when None)."""
        k, v = self.k[layer], self.v[layer]
        if slots is None:
            return k[:, :, :kv_len], v[:, :, :kv_len]
        return k[slots, :, :kv_len], v[slots, :, :kv_len]
