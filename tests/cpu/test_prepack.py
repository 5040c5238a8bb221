"""Packed (oneDNN-layout) weights: the same logits and tokens as plain weights, the same
weight accounting, and inference only."""

from __future__ import annotations

import pytest
import torch

from engine.models import packed
from engine.models.loading import load_model
from engine.models.packed import PackedLinear, prepack_supported

pytestmark = pytest.mark.skipif(not prepack_supported(torch.device("cpu"), torch.float32),
                                reason="this torch build has no oneDNN")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_and_plain_weights_give_the_same_logits(kit_dir, dtype):
    if not prepack_supported(torch.device("cpu"), getattr(torch, dtype)):
        pytest.skip(f"oneDNN has no {dtype} path on this CPU (see the test below for that case)")
    plain = load_model(kit_dir / "target", "cpu", dtype, prepack=False).model
    packed = load_model(kit_dir / "target", "cpu", dtype, prepack=True).model
    assert packed.prepacked and not plain.prepacked
    assert any(isinstance(m, PackedLinear) for m in packed.modules())
    assert packed.step_weight_bytes() == plain.step_weight_bytes()
    assert packed.num_parameters() == plain.num_parameters()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, plain.shape.vocab_size, (2, 7), generator=gen)
    pos = torch.arange(7).expand(2, -1)
    a = plain(tokens, pos, plain.new_cache(2, 40), 32)
    b = packed(tokens, pos, packed.new_cache(2, 40), 32)
    tol = 1e-4 if dtype == "float32" else 2e-2  # float32: another summation order (oneDNN vs BLAS)
    assert torch.allclose(a, b, atol=tol, rtol=tol)
    step = torch.randint(0, plain.shape.vocab_size, (2, 1), generator=gen)
    caches = plain.new_cache(2, 40), packed.new_cache(2, 40)
    for model, cache in zip((plain, packed), caches):
        model(tokens, pos, cache, 32, logits_at="none")
    a = plain(step, pos[:, -1:] + 1, caches[0], 32)
    b = packed(step, pos[:, -1:] + 1, caches[1], 32)
    assert torch.allclose(a, b, atol=tol, rtol=tol)


def test_auto_packs_on_cpu_and_refuses_elsewhere(kit_dir):
    assert load_model(kit_dir / "target", "cpu", "float32").model.prepacked  # auto on this CPU
    fp64 = load_model(kit_dir / "target", "cpu", "float64").model
    assert not fp64.prepacked
    with pytest.raises(ValueError, match="prepacking needs"):
        fp64.prepack()


def test_bfloat16_without_a_onednn_bf16_path_keeps_plain_weights(kit_dir, monkeypatch):
    """An AVX2-only CPU (no AVX512-BW, no AVX-NE-CONVERT): a bfloat16 model loads and decodes
    with plain weights, and an explicit prepack is refused with the reason, not a oneDNN crash."""
    monkeypatch.setattr(packed, "onednn_bf16", lambda: False)
    model = load_model(kit_dir / "target", "cpu", "bfloat16").model
    assert not model.prepacked and model.dtype == torch.bfloat16
    tokens = torch.randint(0, model.shape.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    logits = model(tokens, torch.arange(5)[None], model.new_cache(1, 16), 16)
    assert torch.isfinite(logits.float()).all()
    with pytest.raises(ValueError, match="AVX512-BW"):
        model.prepack()
    with pytest.raises(ValueError, match="AVX512-BW"):
        load_model(kit_dir / "target", "cpu", "bfloat16", prepack=True)
