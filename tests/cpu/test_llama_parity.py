"""Our Llama forward against transformers' LlamaForCausalLM: prefill, then incremental steps,
rows of different lengths in one batch, GQA and llama3 rope scaling (the kit uses both); with
torch's SDPA (the CPU's default, query heads folded: `folded_attention`) and with
`grouped_attention` (CUDA's)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

import engine.models.attention as attention_paths
import engine.models.llama as llama
from engine.models.attention import fold_pays, folded_attention, grouped_attention
from engine.models.llama import LlamaLM, LlamaShape
from engine.models.loading import ModelLoadError, load_model


@pytest.fixture(scope="module")
def pair(kit_dir):
    ours = load_model(kit_dir / "target", dtype="float32")
    ref = LlamaForCausalLM.from_pretrained(str(kit_dir / "target"), dtype=torch.float32).eval()
    return ours, ref


@pytest.fixture(params=["sdpa", "grouped"])
def attention(request, pair):
    pair[0].model.attention = request.param
    yield request.param
    pair[0].model.attention = "auto"


def reference_logits(ref, ids, columns):
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0][:, columns]


def test_prefill_and_incremental_match_transformers_with_ragged_rows(pair, attention):
    ours, ref = pair
    model, columns = ours.model, ours.model.output_token_ids
    gen = torch.Generator().manual_seed(0)
    lengths = [9, 17, 4]
    rows = [torch.randint(0, ours.layout.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    width = max(lengths)
    tokens = torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    cache = model.new_cache(3, 64)
    logits = model(tokens, torch.arange(width).expand(3, -1), cache, kv_len=32)
    for i, r in enumerate(rows):
        ref_logits = reference_logits(ref, r, columns)
        assert torch.allclose(logits[i, : len(r)], ref_logits, atol=1e-4, rtol=1e-4)
    # three incremental rounds; each row continues from its own length (right padding of the
    # prefill is overwritten), with 1, 3 and 2 new tokens per round
    for step, t in enumerate((1, 3, 2)):
        new = torch.randint(ours.layout.first_code, ours.layout.vocab_size, (3, t), generator=gen)
        lens = torch.tensor([len(r) for r in rows])
        pos = lens[:, None] + torch.arange(t)
        logits = model(new, pos, cache, kv_len=64)
        for i in range(3):
            rows[i] = rows[i] + new[i].tolist()
            ref_logits = reference_logits(ref, rows[i], columns)[-t:]
            assert torch.allclose(logits[i], ref_logits, atol=1e-4, rtol=1e-4), (step, i)


def test_cache_slots_let_rows_live_anywhere_in_the_batch(pair, attention):
    ours, ref = pair
    model, columns = ours.model, ours.model.output_token_ids
    ids = list(range(700, 712))
    cache = model.new_cache(4, 32)
    slot = torch.tensor([2])
    model(torch.tensor([ids[:-1]]), torch.arange(11)[None], cache, 16, slots=slot, logits_at="none")
    last = model(torch.tensor([ids[-1:]]), torch.tensor([[11]]), cache, 16, slots=slot)
    assert torch.allclose(last[0, 0], reference_logits(ref, ids, columns)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_attention_is_torchs_masked_grouped_query_attention(monkeypatch, dtype):
    """Query heads sharing a KV head, several query positions per row at per-row positions,
    rows split into chunks (a scores budget of one row): torch's SDPA, computed in float32."""
    gen = torch.Generator().manual_seed(1)
    for b, heads, kv_heads, t, length, d in [(3, 8, 2, 1, 17, 16), (2, 4, 4, 5, 9, 8), (4, 6, 3, 7, 40, 16)]:
        q = torch.randn(b, t, heads, d, generator=gen).to(dtype).transpose(1, 2)  # strided, as in the model
        k, v = (torch.randn(b, kv_heads, length, d, generator=gen).to(dtype) for _ in range(2))
        last = torch.randint(t - 1, length, (b, 1), generator=gen)
        positions = last - torch.arange(t).flip(0)  # [b, T], each row's own
        mask = torch.arange(length)[None, None, None, :] <= positions[:, None, :, None]
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                                enable_gqa=True)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: the output's own rounding
        out = grouped_attention(q, k, v, mask)
        assert out.dtype == dtype and out.shape == (b, heads, t, d)
        assert torch.allclose(out.float(), ref, atol=tol, rtol=tol)
        monkeypatch.setattr(attention_paths, "GROUPED_SCORES_BYTES", heads * t * length * 4)
        assert torch.equal(grouped_attention(q, k, v, mask), out)
        monkeypatch.undo()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_attention_is_torchs_grouped_query_sdpa(dtype):
    """Each KV head's query heads folded into its query positions: torch's SDPA with `enable_gqa`
    within its output's last bit, at one position and at several (where the model folds is
    `fold_pays`); query head h reads KV head h // (H / H_kv) (every KV head's values
    differ, so a wrong pairing is far off)."""
    gen = torch.Generator().manual_seed(2)
    assert fold_pays(torch.bfloat16, 1) and fold_pays(torch.float32, 4) and not fold_pays(torch.float32, 1)
    for b, heads, kv_heads, t, length, d in [(3, 8, 2, 1, 17, 16), (2, 4, 4, 5, 9, 8), (4, 6, 3, 7, 40, 16),
                                             (5, 32, 8, 1, 64, 32)]:
        q = torch.randn(b, t, heads, d, generator=gen).to(dtype).transpose(1, 2)  # strided, as in the model
        k = torch.randn(b, kv_heads, length, d, generator=gen).to(dtype)
        v = (torch.randn(b, kv_heads, length, d, generator=gen) + 10 * torch.arange(kv_heads)[:, None, None]).to(dtype)
        last = torch.randint(t - 1, length, (b, 1), generator=gen)
        mask = torch.arange(length)[None, None, None, :] <= (last - torch.arange(t).flip(0))[:, None, :, None]
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        tol = 1e-5 if dtype == torch.float32 else 0.1  # bfloat16: a last bit of outputs near 10 * head
        out = folded_attention(q, k, v, mask)
        assert out.dtype == dtype and out.shape == (b, heads, t, d)
        assert torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol), (b, heads, kv_heads, t)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_is_transformers_bit_for_bit_in_every_dtype(dtype):
    """Our RMSNorm (torch's fused op, which computes a half-precision input in float32 and rounds
    once) against transformers' (normalise in float32, round, scale in the input dtype)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(5)
    for width, rows in ((64, (3, 7)), (2048, (32, 4)), (128, (1, 33))):
        ours, ref = llama.RMSNorm(width, 1e-5), LlamaRMSNorm(width, eps=1e-5)
        weight = (torch.rand(width, generator=gen) * 2).to(dtype)
        ours.weight.data, ref.weight.data = weight.clone(), weight.clone()
        x = (torch.randn(*rows, width, generator=gen) * 4).to(dtype)
        with torch.no_grad():
            got, want = ours(x), ref(x)
        assert got.dtype == want.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_compute_what_the_separate_ones_do(bias):
    """`fuse_projections` (every decoding model's): one q/k/v product and one gate/up product
    per layer give the separate projections' logits, biases included, and keep the weights."""
    shape = LlamaShape(vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       attention_bias=bias, mlp_bias=bias, max_position_embeddings=4096)
    gen = torch.Generator().manual_seed(3)
    plain = LlamaLM(shape, torch.arange(100, 300), 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16))
    for p in plain.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.2
    fused = copy.deepcopy(plain)
    fused.fuse_projections()
    attn = fused.model.layers[1].self_attn
    assert plain.model.layers[1].self_attn.qkv_proj is None and fused.model.layers[0].mlp.gate_up_proj is not None
    assert not hasattr(attn, "q_proj") and (attn.qkv_proj.bias is not None) == bias  # no second copy
    assert torch.equal(attn.qkv_proj.weight[:64], plain.model.layers[1].self_attn.q_proj.weight)
    assert fused.num_parameters() == plain.num_parameters()
    assert fused.step_weight_bytes() == plain.step_weight_bytes()
    tokens = torch.randint(0, 300, (3, 7), generator=gen)
    logits = []
    for m in (plain, fused):
        cache = m.new_cache(4, 16)
        slots = torch.tensor([3, 0, 2])
        first = m(tokens[:, :5], torch.arange(5).expand(3, -1), cache, 8, slots=slots)
        step = m(tokens[:, 5:], torch.tensor([[5, 6], [2, 3], [4, 5]]), cache, 8, slots=slots)
        logits.append(torch.cat([first, step], 1))
    assert torch.allclose(logits[1], logits[0], atol=1e-5, rtol=1e-5)
    fused.fuse_projections()  # already fused: nothing changes
    assert fused.model.layers[1].self_attn is attn
    plain.prepack()
    with pytest.raises(ValueError, match="before prepacking"):
        plain.fuse_projections()


def test_head_is_restricted_to_speech_and_end_of_speech(pair):
    ours, _ = pair
    layout = ours.layout
    assert ours.model.vocab_out == 65537
    assert ours.model.output_token_ids[0] == layout.first_code
    assert ours.model.output_token_ids[-1] == layout.eos_token


def test_missing_or_foreign_checkpoints_fail_clearly(tmp_path, kit_dir):
    with pytest.raises(ModelLoadError, match="does not exist.*kit build"):
        load_model(tmp_path / "nope")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelLoadError, match="gpt2"):
        load_model(tmp_path)


LLAMA3 = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}
BASE = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "head_dim": 32,
        "max_position_embeddings": 131072}


def transformers_rope(config: dict) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(LlamaConfig(**config))
    return rotary.inv_freq, float(rotary.attention_scaling)


@pytest.mark.parametrize("rope", [
    {"rope_theta": 500000.0, "rope_scaling": LLAMA3},  # Llasa's (transformers 4's layout)
    {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}},  # transformers 5's
    {"rope_theta": 10000.0, "rope_scaling": {**LLAMA3, "factor": 8.0, "original_max_position_embeddings": 2048}},
    {"rope_theta": 10000.0},  # default rope, no scaling
    {"rope_theta": 10000.0, "rope_scaling": None},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    {"rope_theta": 10000.0, "rope_scaling": {"type": "default"}},
    {"rope_theta": 10000.0, "head_dim": None, "hidden_size": 96, "num_attention_heads": 3},
])
def test_own_rope_tables_equal_transformers_bit_for_bit(rope):
    from engine.models.loading import own_rope_tables

    config = {**BASE, **rope}
    ours = own_rope_tables(config)
    assert ours is not None  # computed without transformers
    ref = transformers_rope(config)
    assert ours[0].dtype == ref[0].dtype and torch.equal(ours[0], ref[0]) and ours[1] == ref[1]


@pytest.mark.parametrize("rope", [
    {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0, "partial_rotary_factor": 0.5}},
    {},  # no rope_theta: transformers' default applies
])
def test_other_ropes_take_transformers_tables(rope):
    from engine.models.loading import own_rope_tables, rope_tables

    config = {**BASE, **rope}
    assert own_rope_tables(config) is None
    ours, ref = rope_tables(config), transformers_rope(config)
    assert torch.equal(ours[0], ref[0]) and ours[1] == ref[1]
