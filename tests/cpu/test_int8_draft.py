"""int8 draft weights (`Int8Linear`, `models.draft_weights: int8`): close to the float product,
rows independent of their batch, half the bytes a step reads, and decoding that keeps every
guarantee (greedy equals the target's greedy; a row decodes as it would alone)."""

from __future__ import annotations

import warnings

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.bench.presets import LoadOptions, load_synthesizer
from engine.cli import main
from engine.config import ModelsSpec
from engine.models.loading import load_model
from engine.models.quant import Int8Linear, cpu_vnni, int8_supported
from engine.runtime.plan import make_plan, settings_fingerprint
from engine.runtime.worker import ShardProcessor

from jobhelpers import job_spec, texts, write_manifest

pytestmark = pytest.mark.skipif(not int8_supported("cpu"), reason="this torch build has no oneDNN int8 matmul")

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog.", "Call Stella.",
         "Numbers like one, two, three.", "Hong Kong and Paris."]


def test_int8_linear_is_close_to_the_float_product_and_rows_are_independent():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=gen) * 0.05, torch.randn(96, generator=gen)
    x = torch.randn(6, 64, generator=gen)
    x[1, 3] = 40.0  # an outlier feature, as Llama hidden states have
    x[4] = 0.7  # a constant row: zero range
    layer = Int8Linear(weight, bias)
    y, ref = layer(x), F.linear(x, weight, bias)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert ((y - ref).norm(dim=1) / ref.norm(dim=1)).max() < 0.02
    # zero range: no division by zero, and the row is c W 1 up to the weights' rounding
    assert torch.allclose(y[4], ref[4], atol=1e-2)
    for i in range(len(x)):  # a row's result does not depend on the rows beside it
        assert torch.equal(layer(x[i:i + 1]), y[i:i + 1])
        assert torch.equal(layer(x[[i, (i + 2) % 6, (i + 1) % 6]])[0], y[i])
    assert layer(x.view(2, 3, 64)).shape == (2, 3, 96)
    assert layer.weight_bytes() == 96 * 64 + 96 * 4
    with pytest.raises(ValueError, match="CPU"):
        Int8Linear(torch.empty(4, 4, device="meta"))


def test_int8_sums_are_exact_even_where_every_product_is_largest():
    """Weights and inputs that quantise exactly, at the extremes (every weight +-127, every uint8
    input at its top, 2 levels + 1): the largest pair sums oneDNN's kernel forms. On a CPU without
    VNNI (AVX2) full-range inputs made them saturate its int16 pair sums; the result must equal
    the exact product on any CPU."""
    assert Int8Linear(torch.ones(2, 2)).levels == (127 if cpu_vnni() else 63)
    weight = torch.ones(8, 64)
    weight[:, ::7] = -1.0  # a few negative products too; per-channel scale 1 / 127: weights +-127
    x = torch.ones(3, 64)
    x[:, 0] = -1.0  # range [-1, 1]: every other input quantises to the top level
    x[1] *= 4.0
    exact = (x.double() @ weight.double().T).float()
    assert torch.allclose(Int8Linear(weight)(x), exact, rtol=1e-5, atol=1e-4)


def test_int8_draft_reads_a_quarter_of_float32_and_stays_close(kit_dir):
    native = load_model(kit_dir / "draft", "cpu", "float32").model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        int8 = load_model(kit_dir / "draft", "cpu", "float32", weights="int8").model
    slower = [w for w in caught if "slower than native" in str(w.message)]
    assert len(slower) == (0 if cpu_vnni() else 1)  # without VNNI int8 does not pay: said so
    # per layer q/k/v, o, gate/up and down (fused: `LlamaLM.fuse_projections`), and the head
    assert sum(isinstance(m, Int8Linear) for m in int8.modules()) == 4 * native.shape.num_layers + 1
    assert int8.num_parameters() == native.num_parameters()
    ratio = int8.step_weight_bytes() / native.step_weight_bytes()
    assert 0.25 <= ratio < 0.27, ratio  # int8 instead of float32, plus scales and norms
    tokens = torch.randint(0, native.shape.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9).expand(3, -1)
    p = native(tokens, pos, native.new_cache(3, 16), 16).softmax(-1)
    q = int8(tokens, pos, int8.new_cache(3, 16), 16).softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    assert tv.max() < 0.1, tv.max()
    with pytest.raises(ValueError, match="already stored"):
        int8.quantize_int8()
    with pytest.raises(ValueError, match="eagerly"):
        load_model(kit_dir / "draft", "cpu", "float32", weights="int8", compile="inductor")
    with pytest.raises(ValueError, match="weights must be one of"):
        load_model(kit_dir / "draft", "cpu", "float32", weights="int4")


@pytest.fixture(scope="module")
def synth_int8(kit_dir, kit_groups):
    """float64 models (so batched and single-row forwards agree exactly), int8 draft."""
    s = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu", dtype="float64",
                         draft_weights="int8", batch_size=4)
    s.set_groups(kit_groups)
    return s


def codes(results) -> list:
    return [r.codes for r in results]


def test_greedy_speculation_with_an_int8_draft_equals_the_greedy_target(synth_int8):
    reference, _ = synth_int8.synthesize(TEXTS, DecodingSettings(method="ar", temperature=0, max_new_tokens=24))
    results, summary = synth_int8.synthesize(
        TEXTS, DecodingSettings(method="exact", temperature=0, gamma=3, max_new_tokens=24), batch_size=3)
    assert codes(results) == codes(reference)
    assert summary.to_dict()["mean_accepted_length"] > 1.0  # the int8 draft's proposals are accepted


def test_rows_decode_with_an_int8_draft_as_they_would_alone(synth_int8, kit_groups):
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, max_new_tokens=20, seed=3)
    items = [SynthesisItem(text=t, id=f"row{i}") for i, t in enumerate(TEXTS)]  # seeds follow ids
    alone = [synth_int8.synthesize([item], settings, batch_size=1)[0][0].codes for item in items]
    together, _ = synth_int8.synthesize(items[::-1], settings, batch_size=4)
    assert codes(together) == alone[::-1]
    assert len(set(map(tuple, alone))) == len(items)


def test_draft_weights_setting_is_checked_and_reaches_generate(kit_dir, tmp_path):
    with pytest.raises(ValueError, match="eagerly"):
        ModelsSpec(target="t", draft="d", codec="c", draft_weights="int8", compile="inductor")
    with pytest.raises(ValueError):
        ModelsSpec(target="t", draft="d", codec="c", draft_weights="int4")
    with pytest.raises(ValueError, match="eagerly"):  # refused before any model loads
        load_synthesizer("tiny", kit=str(kit_dir), options=LoadOptions("cpu", compile="inductor", draft_weights="int8"))
    out = tmp_path / "codes.json"
    assert main(["generate", "--kit", str(kit_dir), "--text", "Hello there.", "--method", "pcg",
                 "--draft-weights", "int8", "--max-new-tokens", "16", "--device", "cpu",
                 "--out", str(out), "--quiet"]) == 0
    assert out.is_file()


def test_a_job_worker_with_an_int8_draft_gives_the_apis_codes(kit_dir, kit_groups, synth_int8, tmp_path):
    rows = texts(6)
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    models={"dtype": "float64", "draft_weights": "int8"},
                    decoding={"method": "pcg", "theta": kit_groups.theta, "max_new_tokens": 16, "seed": 3},
                    resources={"workers": 1, "batch_size": 4, "rows_per_shard": 3})
    native = spec.model_copy(update={"models": spec.models.model_copy(update={"draft_weights": "native"})})
    assert settings_fingerprint(spec)["models"]["draft_weights"] == "int8"
    assert "draft_weights" not in settings_fingerprint(native)["models"]  # older outputs' plans unchanged
    processor = ShardProcessor(spec, kit_groups)
    try:
        assert any(isinstance(m, Int8Linear) for m in processor.synth.draft.model.modules())
        records = [processor.submit(s).result(timeout=600) for s in make_plan(spec, processor.storage).shards]
    finally:
        processor.close()
    out = {row["id"]: row["codes"] for r in records for row in pq.read_table(r.data).to_pylist()}
    items = [SynthesisItem(text=r["text"], id=r["id"]) for r in rows]
    results, _ = synth_int8.synthesize(items, spec.decoding, batch_size=2)
    assert {r.id: r.codes for r in results} == out
