"""The decode step through torch.compile (inductor, CPU): the same greedy tokens and matching
logits as the eager step, a bounded number of graphs, clear refusals. The compiled model is the
kit target's first layer alone (`init_draft`): the step's code is the same for any number of
layers, and inductor's tracing and C++ builds grow with them (4 layers: about 100 s of compiling
on the 2-core AVX2 VM, 1 layer: about 35 s)."""

from __future__ import annotations

import pytest
import torch

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.config import JobSpec
from engine.models.llama import COMPILED_MAX_WIDTH, KV_BUCKET
from engine.models.loading import load_model

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def one_layer(kit_dir, tmp_path_factory):
    from engine.draft.init import init_draft

    out = tmp_path_factory.mktemp("compile") / "one-layer"
    init_draft(kit_dir / "target", out, layers=[0])
    return out


@pytest.fixture(scope="module")
def compiled(one_layer):
    return Synthesizer.load(one_layer, device="cpu", dtype="float32", compile="inductor")


def test_compiled_step_gives_the_eager_greedy_tokens_and_logits(one_layer, compiled):
    from torch._dynamo.utils import counters

    model = compiled.target.model
    assert model.compile_mode == "inductor" and not model.prepacked  # inductor packs its own weights
    assert model.shape.num_layers == 1
    eager = Synthesizer.load(one_layer, device="cpu", dtype="float32", compile="none")
    settings = DecodingSettings(method="ar", temperature=0, max_new_tokens=24)
    graphs = counters["stats"]["unique_graphs"]
    # the first row's budget ends it first: batch 2, then batch 1
    items = [SynthesisItem(text=TEXTS[0], max_new_tokens=10), SynthesisItem(text=TEXTS[1])]
    ref, _ = eager.synthesize(items, settings, batch_size=2)
    out, _ = compiled.synthesize(items, settings, batch_size=2)
    assert [r.codes for r in out] == [r.codes for r in ref] and all(r.codes for r in out)
    assert len(out[0].codes) < len(out[1].codes)
    # one graph for every batch of 2 or more rows (the batch sized apart from the cache's other
    # sizes: the kit has 2 KV heads), one for a single row
    assert counters["stats"]["unique_graphs"] - graphs == 2
    more = [SynthesisItem(text=t, max_new_tokens=n) for t, n in zip(
        TEXTS + ["A third row.", "And a fourth, longer, sentence for the batch."], (6, 12, 18, 24))]
    ref, _ = eager.synthesize(more, settings, batch_size=4)
    out, _ = compiled.synthesize(more, settings, batch_size=4)
    assert [r.codes for r in out] == [r.codes for r in ref]
    assert counters["stats"]["unique_graphs"] - graphs == 2  # batches 4, 3, 2 and 1: no new graph

    plain = load_model(one_layer, "cpu", "float32", prepack=False).model
    gen = torch.Generator().manual_seed(2)
    width = COMPILED_MAX_WIDTH + 3  # a prefill: eager in both
    prompt = torch.randint(0, plain.shape.vocab_size, (2, width + 1), generator=gen)
    pos = torch.arange(width + 1).repeat(2, 1)
    logits = []
    for m in (plain, model):
        cache = m.new_cache(2, 80)
        m(prompt[:, :width], pos[:, :width], cache, width, logits_at="none")
        logits.append(m(prompt[:, width:], pos[:, width:], cache, width + 1))  # compiled: keys read up to KV_BUCKET
    assert logits[1].shape == logits[0].shape == (2, 1, plain.vocab_out)
    assert torch.allclose(logits[1], logits[0], atol=1e-4, rtol=1e-4)
    assert KV_BUCKET > width + 1  # the compiled step did read masked keys past the eager one's


def test_compile_refusals(kit_dir, compiled):
    model = compiled.target.model
    with pytest.raises(ValueError, match="cudagraphs needs a CUDA device"):
        load_model(kit_dir / "target", "cpu", "float32", prepack=False).model.compile_step("cudagraphs")
    with pytest.raises(ValueError, match="compile must be one of none, inductor, cudagraphs"):
        model.compile_step("max")
    with pytest.raises(ValueError, match="not prepacked"):
        load_model(kit_dir / "target", "cpu", "float32", prepack=True).model.compile_step("inductor")
    spec = {"name": "j", "input": {"manifests": ["m.jsonl"]}, "output": {"uri": "out"},
            "models": {"target": "t", "codec": "c", "compile": "fast"}}
    with pytest.raises(ValueError, match="compile"):
        JobSpec.model_validate(spec)
