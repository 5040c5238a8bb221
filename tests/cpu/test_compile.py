"""The decode step through torch.compile (inductor, CPU): the same greedy tokens and matching
logits as the eager step on the kit, a bounded number of graphs, clear refusals."""

from __future__ import annotations

import pytest
import torch

from engine import DecodingSettings, Synthesizer
from engine.config import JobSpec
from engine.models.llama import KV_BUCKET
from engine.models.loading import load_model

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def compiled(kit_dir):
    return Synthesizer.load(kit_dir / "target", device="cpu", dtype="float32", compile="inductor")


def test_compiled_step_gives_the_eager_greedy_tokens_and_logits(kit_dir, compiled):
    model = compiled.target.model
    assert model.compile_mode == "inductor" and not model.prepacked  # inductor packs its own weights
    eager = Synthesizer.load(kit_dir / "target", device="cpu", dtype="float32", compile="none")
    settings = DecodingSettings(method="ar", temperature=0, max_new_tokens=24)
    ref, _ = eager.synthesize(TEXTS, settings, batch_size=2)
    out, _ = compiled.synthesize(TEXTS, settings, batch_size=2)
    assert [r.codes for r in out] == [r.codes for r in ref] and all(r.codes for r in out)

    plain = load_model(kit_dir / "target", "cpu", "float32", prepack=False).model
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, plain.shape.vocab_size, (2, 9), generator=gen)
    step = torch.randint(0, plain.shape.vocab_size, (2, 1), generator=gen)
    pos = torch.arange(9).expand(2, -1)
    logits = []
    for m in (plain, model):
        cache = m.new_cache(2, 80)
        m(prompt, pos, cache, 9, logits_at="none")  # prefill: eager in both
        logits.append(m(step, pos[:, -1:] + 1, cache, 10))  # compiled: keys read up to KV_BUCKET
    assert logits[1].shape == logits[0].shape == (2, 1, plain.vocab_out)
    assert torch.allclose(logits[1], logits[0], atol=1e-4, rtol=1e-4)
    assert KV_BUCKET > 10  # the compiled step did read masked keys past the eager one's


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
