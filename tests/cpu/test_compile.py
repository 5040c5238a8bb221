"""The decode step through torch.compile (inductor, CPU): the same greedy tokens and matching
logits as the eager step on the kit, a bounded number of graphs, clear refusals."""

from __future__ import annotations

import pytest
import torch

from engine import DecodingSettings, Synthesizer
from engine.config import JobSpec
from engine.models.llama import COMPILED_MAX_WIDTH, KV_BUCKET
from engine.models.loading import load_model

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def compiled(kit_dir):
    return Synthesizer.load(kit_dir / "target", device="cpu", dtype="float32", compile="inductor")


def test_compiled_step_gives_the_eager_greedy_tokens_and_logits(kit_dir, compiled):
    from torch._dynamo.utils import counters

    model = compiled.target.model
    assert model.compile_mode == "inductor" and not model.prepacked  # inductor packs its own weights
    eager = Synthesizer.load(kit_dir / "target", device="cpu", dtype="float32", compile="none")
    settings = DecodingSettings(method="ar", temperature=0, max_new_tokens=24)
    graphs = counters["stats"]["unique_graphs"]
    ref, _ = eager.synthesize(TEXTS, settings, batch_size=2)
    out, _ = compiled.synthesize(TEXTS, settings, batch_size=2)
    assert [r.codes for r in out] == [r.codes for r in ref] and all(r.codes for r in out)
    assert len({len(r.codes) for r in out}) == 2  # a row ended first: batch 2, then batch 1
    # one graph for every batch of 2 or more rows (the batch sized apart from the cache's other
    # sizes: the kit has 2 KV heads), one for a single row
    assert counters["stats"]["unique_graphs"] - graphs == 2
    more = TEXTS + ["A third row.", "And a fourth, longer, sentence for the batch."]
    ref, _ = eager.synthesize(more, settings, batch_size=4)
    out, _ = compiled.synthesize(more, settings, batch_size=4)
    assert [r.codes for r in out] == [r.codes for r in ref]
    assert counters["stats"]["unique_graphs"] - graphs == 2  # batches 4, 3 and 2: no new graph

    plain = load_model(kit_dir / "target", "cpu", "float32", prepack=False).model
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
