"""A compact Llama forward that loads Hugging Face weights (the gpt-fast approach).

Why not drive transformers' model: speculative decoding needs per-row positions, a static cache
written by position, and an LM head restricted to the columns the sampler may emit. Here all
three are a few lines. Parameter names follow transformers' `LlamaForCausalLM`, so its
safetensors load directly; `tests/cpu/test_llama_parity.py` pins the logits against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import COMPILE_MODES
from engine.models.attention import attend, fold_mask, fold_pays, wide
from engine.models.kv_cache import KVCache
from engine.models.packed import PackedLinear, prepack_supported
from engine.models.quant import Int8Linear

LogitsAt = Literal["all", "last", "none", "hidden", "normed"]


@dataclass(frozen=True)
class LlamaShape:
    """The parts of a Hugging Face Llama `config.json` the forward needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    max_position_embeddings: int

    @classmethod
    def from_config(cls, config: dict) -> LlamaShape:
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            max_position_embeddings=config.get("max_position_embeddings", 131072),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and scale in the input dtype, as transformers does (bit for bit:
        # tests/cpu/test_llama_parity.py); in one fused op where the input is float32 or float64.
        # For a bfloat16 or float16 input torch's rms_norm itself computes in float32 and rounds
        # once at the end, as `.float()` ... `.to(x.dtype)` would, without the two copies.
        if x.dtype in (torch.float32, torch.float64):
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x, self.weight.shape, None, self.eps)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        h, d, bias = shape.hidden_size, shape.head_dim, shape.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, d
        self.q_proj = nn.Linear(h, shape.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, shape.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, shape.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(shape.num_heads * d, h, bias=bias)
        self.qkv_proj: nn.Module | None = None  # `fuse`: q, k and v projections as one

    def fuse(self) -> None:
        """Replace the q, k and v projections by one (their weights stacked by output)."""
        self.qkv_proj = stacked_linear(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        x: torch.Tensor,  # [b, T, h]
        tables: StepTables,  # the step's mask [b, 1, T, kv_len] (True = attend) and rope tables
        cache: KVCache,
        layer: int,
        slots: torch.Tensor | None,  # cache rows read (None: rows 0..b-1, read as a view)
        rows: torch.Tensor,  # [b, 1] cache rows written
        positions: torch.Tensor,  # [b, T]
        kind: str = "sdpa",  # the attention path (`engine.models.attention.attend`); `folded`: the
        # mask folded beforehand (`fold_mask`)
    ) -> torch.Tensor:
        b, t, _ = x.shape
        mask, cos, sin = tables
        heads, kv_heads, d = self.num_heads, self.num_kv_heads, self.head_dim
        # heads stay after positions, `[b, T, heads, D]`, until attention: the layout the cache
        # writes take, so only the queries are transposed
        if self.qkv_proj is not None:  # one product, one rotation for the query and key heads
            qk, v = self.qkv_proj(x).view(b, t, heads + 2 * kv_heads, d).split([heads + kv_heads, kv_heads], 2)
            q, k = apply_rope(qk, cos, sin).split([heads, kv_heads], 2)
        else:
            q = self.q_proj(x).view(b, t, heads, d)
            k = self.k_proj(x).view(b, t, kv_heads, d)
            v = self.v_proj(x).view(b, t, kv_heads, d)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = q.transpose(1, 2)  # [b, H, T, D]
        cache.write(layer, rows, positions, k, v)
        keys, values = cache.read(layer, slots, mask.shape[-1])  # [b, H_kv, kv_len, D]
        out = attend(q, keys, values, mask, kind)
        # [b, H, T, D] -> [b, T, H * D]; at one position the heads are already in that order
        return self.o_proj(out.reshape(b, t, -1) if t == 1 else out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        h, i, bias = shape.hidden_size, shape.intermediate_size, shape.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.gate_up_proj: nn.Module | None = None  # `fuse`: gate and up projections as one

    def fuse(self) -> None:
        """Replace the gate and up projections by one (their weights stacked by output)."""
        self.gate_up_proj = stacked_linear(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def stacked_linear(*parts: nn.Linear) -> nn.Linear:
    """One linear layer computing `parts` side by side: weights (and biases) stacked by output."""
    weight = torch.cat([p.weight.detach() for p in parts])
    bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, tables: StepTables, cache: KVCache, index: int, slots: torch.Tensor | None,
                rows: torch.Tensor, positions: torch.Tensor, kind: str) -> torch.Tensor:
        """The layer on `x` `[b, T, h]`: its keys and values go to layer `index` of `cache` (see
        `Attention.forward` for the rest)."""
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, tables, cache, index, slots, rows, positions, kind)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """`model.*` of a `LlamaForCausalLM` checkpoint."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        # weights come from a checkpoint: no random init (on the meta device, where models are built,
        # nn.Embedding's normal_ would import torch's compiler stack, seconds for a fresh process)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size,
                                         _weight=torch.empty(shape.vocab_size, shape.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[b, T, H, D]` by per-row angles (half-split layout): `cos` and `sin` `[b, T, 1, D]`
    from `LlamaLM.rope`, whose `sin` carries the sign of the rotated half, so that
    `x * cos + rotate_half(x) * sin` is `x * cos + roll(x) * sin` (the same values, fewer ops)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class StepTables(NamedTuple):
    """What a step's layers share: the attention mask `[b, 1, T, kv_len]` (True = attend) and
    the rope tables `[b, T, 1, D]` (`LlamaLM.rope`)."""

    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def columns(self, start: int, stop: int) -> StepTables:
        """The tables of positions `start:stop` of those they were made for."""
        return StepTables(self.mask[:, :, start:stop], self.cos[:, start:stop], self.sin[:, start:stop])


class LlamaLM(nn.Module):
    """Llama causal LM whose head emits only `output_token_ids` (e.g. speech + end-of-speech).

    Args:
        shape: model dimensions.
        output_token_ids: `[V_out]` vocabulary ids of the head's rows, in output order.
        inv_freq: `[D/2]` rotary inverse frequencies.
        rope_scaling: factor on cos/sin (transformers' `attention_scaling`).
    """

    def __init__(
        self,
        shape: LlamaShape,
        output_token_ids: torch.Tensor,
        inv_freq: torch.Tensor,
        rope_scaling: float = 1.0,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.model = LlamaBody(shape)
        self.head = nn.Parameter(torch.empty(len(output_token_ids), shape.hidden_size))
        self.register_buffer("output_token_ids", output_token_ids.long(), persistent=False)
        self.set_rope_tables(inv_freq)
        self.rope_scaling = rope_scaling
        self.packed_head: PackedLinear | None = None
        self.compile_mode = "none"  # how decode rounds over this model run (`set_compile_mode`)
        # attention: `sdpa` (torch's SDPA, query heads folded where that is faster:
        # `folded_attention`), `grouped` (`grouped_attention`), or `auto`: grouped on CUDA, SDPA
        # elsewhere (a CPU's fused kernel, pinned against transformers); see `attention_kind`
        self.attention = "auto"

    def prepack(self) -> None:
        """Store every projection and the head in oneDNN's blocked layout (see `PackedLinear`);
        the dense `head` stays for readers of its rows. Call after the weights are loaded and
        placed; the packed model is inference-only and stays on its device."""
        if not prepack_supported(self.device, self.dtype):
            raise ValueError(f"weight prepacking needs a CPU with oneDNN in float32, or in bfloat16 "
                             f"where oneDNN has a bf16 path on the CPU (AVX512-BW/VL/DQ or "
                             f"AVX-NE-CONVERT); this model is {self.dtype} on {self.device}")
        self._replace_projections(PackedLinear)

    def quantize_int8(self) -> None:
        """Store every projection and the head in int8 (`Int8Linear`): about half the bytes
        a CPU decode step reads, for a draft; inference-only, on CPU (`Int8Linear` refuses other
        devices before anything is replaced)."""
        self._replace_projections(Int8Linear)

    def _replace_projections(self, kind: type[nn.Module]) -> None:
        if self.packed_head is not None:
            raise ValueError(f"this model's weights are already stored as {type(self.packed_head).__name__}")
        for owner, name in self.projections():
            linear = getattr(owner, name)
            setattr(owner, name, kind(linear.weight, linear.bias))
        self.packed_head = kind(self.head)

    def projections(self) -> list[tuple[nn.Module, str]]:
        """Every projection of the layers, as (module, attribute name), fused ones as such."""
        out = []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            out += [(attn, n) for n in (("qkv_proj",) if attn.qkv_proj is not None else ("q_proj", "k_proj", "v_proj"))]
            out += [(attn, "o_proj")]
            out += [(mlp, n) for n in (("gate_up_proj",) if mlp.gate_up_proj is not None else ("gate_proj", "up_proj"))]
            out += [(mlp, "down_proj")]
        return out

    def fuse_projections(self) -> None:
        """Compute each layer's q, k and v projections as one product, and its gate and up
        projections as another, for inference: a decode step then launches 3 fewer matrix
        products per layer, and rotates the query and key heads in one pass (fewer ops, which
        is what a host-bound step pays for; see `tests/cpu/test_llama_parity.py` for the
        logits). Before prepacking or int8 (they then store the fused weights)."""
        if self.packed_head is not None:
            raise ValueError("fuse the projections before prepacking or quantising them")
        for layer in self.model.layers:
            if layer.self_attn.qkv_proj is None:
                layer.self_attn.fuse()
                layer.mlp.fuse()

    def share_tables(self, source: LlamaLM) -> list[str]:
        """Use `source`'s output head and input embeddings where this model's hold the very same
        values (a draft made of the target's layers keeps the target's, `draft init`): the two
        models then keep one copy (Llasa-1B's are about 1 GB in bfloat16). The outputs are
        unchanged (the same values,
        stored the same way). For inference; returns what was shared (`head`, `embeddings`)."""
        def same(a: torch.Tensor, b: torch.Tensor) -> bool:
            return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)

        shared = []
        if (type(self.packed_head) is type(source.packed_head) and same(self.head, source.head)
                and torch.equal(self.output_token_ids, source.output_token_ids)):
            self.head, self.packed_head = source.head, source.packed_head
            shared.append("head")
        if same(self.model.embed_tokens.weight, source.model.embed_tokens.weight):
            self.model.embed_tokens = source.model.embed_tokens
            shared.append("embeddings")
        return shared

    @property
    def prepacked(self) -> bool:
        return self.packed_head is not None

    def num_parameters(self) -> int:
        """Weights of the model as loaded (packed projections included), the dense head too."""
        dense = sum(p.numel() for p in self.parameters())
        return dense + sum(m.out_features * m.in_features for m in self.model.modules()
                           if isinstance(m, (PackedLinear, Int8Linear)))

    def step_weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: everything but the embedding table (only
        the fed tokens' rows are gathered); the sliced head counts once."""
        dense = [p for name, p in self.named_parameters()
                 if name != "model.embed_tokens.weight" and (name != "head" or self.packed_head is None)]
        stored = [m for m in self.modules() if isinstance(m, (PackedLinear, Int8Linear))]
        return sum(t.numel() * t.element_size() for t in dense) + sum(m.weight_bytes() for m in stored)

    @property
    def vocab_out(self) -> int:
        return self.head.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.head.dtype

    @property
    def device(self) -> torch.device:
        return self.head.device

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        s = self.shape
        return KVCache(s.num_layers, batch, s.num_kv_heads, max_len, s.head_dim, self.dtype, self.device)

    def set_rope_tables(self, inv_freq: torch.Tensor) -> None:
        """The rotary inverse frequencies `[D/2]`, both halves' `[D]` and the sign of the rotated
        half `[D]` (`apply_rope`), on `inv_freq`'s device."""
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("inv_freq_full", torch.cat([self.inv_freq] * 2), persistent=False)
        ones = torch.ones(len(inv_freq), device=inv_freq.device)
        self.register_buffer("rope_sign", torch.cat([-ones, ones]), persistent=False)

    def same_rope(self, other: LlamaLM) -> bool:
        """Whether `other` rotates positions exactly as this model does (the same tables)."""
        return (self.dtype == other.dtype and self.rope_scaling == other.rope_scaling
                and self.inv_freq_full.device == other.inv_freq_full.device
                and torch.equal(self.inv_freq_full, other.inv_freq_full))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin `[b, T, 1, D]` for `positions` `[b, T]` (see `apply_rope`), computed
        as transformers does: angles in float32 (float64 for a float64 model), then the dtype."""
        inv_freq = self.inv_freq_full.double() if self.dtype == torch.float64 else self.inv_freq_full
        emb = positions[:, :, None, None].to(inv_freq.dtype) * inv_freq  # [b, T, 1, D]
        cos, sin = emb.cos(), emb.sin() * self.rope_sign
        if self.rope_scaling != 1.0:
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        if cos.dtype == self.dtype:
            return cos, sin
        return cos.to(self.dtype), sin.to(self.dtype)

    def set_compile_mode(self, mode: str) -> None:
        """How decode rounds over this model run (`engine.decoding.graphs`): `none` (eager),
        `inductor` (each round one `torch.compile` graph; on CPU with inductor's weight freezing,
        which packs weights itself, so the model must not be prepacked) or `cudagraphs` (CUDA
        only: inductor plus CUDA graph replay). Prefills stay eager in every mode."""
        if mode not in COMPILE_MODES or mode == "auto":
            choices = ", ".join(m for m in COMPILE_MODES if m != "auto")
            raise ValueError(f"compile must be one of {choices}, not {mode!r}")
        if mode == "cudagraphs" and self.device.type != "cuda":
            raise ValueError(f"compile: cudagraphs needs a CUDA device; this model is on {self.device}")
        self.compile_mode = mode

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        kv_len: int,
        slots: torch.Tensor | None = None,
        logits_at: LogitsAt = "all",
    ) -> torch.Tensor | None:
        """Feed `tokens` `[b, T]` at `positions` `[b, T]` into cache rows `slots`.

        Args:
            tokens: vocabulary ids.
            positions: absolute position of each token; rows may differ.
            cache: the KV cache; keys at `positions` are overwritten.
            kv_len: keys `[0, kv_len)` are read; must exceed every position.
            slots: cache rows of the `b` inputs; None means rows `0..b-1` of a cache of `b`.
            logits_at: which positions get head logits; "hidden" returns the final-normed
                hidden states instead (in float32), "normed" the same in the model's dtype
                (`project` turns them into logits).

        Returns:
            float32 logits `[b, T or 1, V_out]` over the output ids, hidden states
            `[b, T, hidden]`, or None.
        """
        with torch.inference_mode():
            return self.step(tokens, positions, cache, kv_len=kv_len, slots=slots, logits_at=logits_at)

    def step_tables(self, positions: torch.Tensor, kv_len: int) -> StepTables:
        """The attention mask and rope tables of `positions` `[b, T]` reading `kv_len` keys; a
        decode round makes them once for every position its steps feed and gives each step its
        columns (`StepTables.columns`)."""
        key_pos = torch.arange(kv_len, device=positions.device)
        mask = (key_pos <= positions[..., None])[:, None]  # [b, 1, T, kv_len]
        return StepTables(mask, *self.rope(positions))

    def attention_kind(self, tokens: torch.Tensor) -> str:
        """The attention a step over `tokens` `[b, T]` takes (`Attention.forward`'s `kind`): as
        `self.attention` says; `auto` is `grouped` on CUDA, else torch's SDPA, with the query heads
        folded where that is faster (`fold_pays`)."""
        if self.attention == "grouped" or (self.attention == "auto" and tokens.is_cuda):
            return "grouped"
        s = self.shape
        return "folded" if s.num_heads > s.num_kv_heads and fold_pays(self.dtype, tokens.shape[1]) else "sdpa"

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, *, kv_len: int,
             slots: torch.Tensor | None = None, logits_at: LogitsAt = "all", widen: bool = True,
             tables: StepTables | None = None) -> torch.Tensor | None:
        """`forward` without inference mode: what a decode round calls. `widen` False: the head's
        logits in the model's dtype (a decode round widens them in its first float32 op, one pass
        over the vocabulary less); `tables`: `step_tables(positions, kv_len)`, made beforehand."""
        mask, cos, sin = tables if tables is not None else self.step_tables(positions, kv_len)
        kind = self.attention_kind(tokens)
        if kind == "folded":  # once for every layer
            mask = fold_mask(mask, self.shape.num_heads // self.shape.num_kv_heads)
        rows = cache.rows if slots is None else slots[:, None]  # [b, 1] cache rows written
        x = self.model.embed_tokens(tokens)  # [b, T, h]
        tables = StepTables(mask, cos, sin)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, tables, cache, i, slots, rows, positions, kind)
        if logits_at == "none":
            return None
        if logits_at == "hidden":
            return wide(self.model.norm(x))
        if logits_at == "normed":  # what `project` takes: the head's logits are then computed as "all"'s
            return self.model.norm(x)
        if logits_at == "last":
            x = x[:, -1:]
        return self.project(self.model.norm(x), widen)

    def project(self, normed: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """The head's logits `[..., V_out]` of final-normed hidden states `[..., hidden]` (float32
        unless `widen` is False: the model's dtype)."""
        logits = self.packed_head(normed) if self.packed_head is not None else F.linear(normed, self.head)
        return wide(logits) if widen else logits
