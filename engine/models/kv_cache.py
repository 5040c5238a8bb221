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
        k: `[L, B, H_kv, S, D]` keys.
        v: `[L, B, H_kv, S, D]` values.
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
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))  # views, made once
        self.rows = torch.arange(batch, device=device)[:, None]  # [B, 1]: every row, for writes

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

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
            k_new: `[b, H_kv, T, D]`.
            v_new: `[b, H_kv, T, D]`.
        """
        # `slots` [b, 1] broadcasts against positions [b, T]; advanced indices split by a slice
        # put their dims first: the target is [b, T, H_kv, D].
        k, v = self.layer(layer)
        k[slots, :, positions] = k_new.transpose(1, 2)
        v[slots, :, positions] = v_new.transpose(1, 2)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[B, H_kv, S, D]` of one layer: views made once (an op less per access
        on the eager path); a compiled round indexes the whole cache, one input to its graph
        rather than one aliasing view per layer."""
        if torch.compiler.is_compiling():
            return self.k[layer], self.v[layer]
        return self.k_layers[layer], self.v_layers[layer]

    def read(
        self, layer: int, slots: torch.Tensor | None, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values `[b, H_kv, kv_len, D]` of `slots` (all rows when None)."""
        k, v = self.layer(layer)
        if slots is None:
            return k[:, :, :kv_len], v[:, :, :kv_len]
        return k[slots, :, :kv_len], v[slots, :, :kv_len]
