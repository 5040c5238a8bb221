"""LLaSA+'s multi-token modules as stream heads (`LlasaPlusHeads`, `import_llasa_plus`), on a
kit-sized checkpoint in LLaSA+'s format (the backbone under `llm.`, modules `mtp_<k>_block`,
`mtp_<k>_proj`, `mtp_<k>_local_RMSNorm`): their logits are those of the same modules run as
LLaSA+ runs them (transformers' Llama decoder layer over the backbone's hidden states, the head
without the final norm), the round keeps their attention caches as a fresh pass would fill them,
and greedy decoding with them equals `ar`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import Warp
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import ExactRule
from engine.models.streams import LlasaPlusHeads, import_llasa_plus, load_streams

from synthhelpers import TEXTS


@pytest.fixture(scope="module")
def llasa_plus_dir(kit_dir, tmp_path_factory):
    """A LLaSA+-format checkpoint over the kit target: its tensors under `llm.`, two modules whose
    decoder layers start from target layers 1 and 2 (small random changes), random projections."""
    target = load_file(str(kit_dir / "target" / "model.safetensors"))
    gen = torch.Generator().manual_seed(5)
    hidden = json.loads((kit_dir / "target" / "config.json").read_text())["hidden_size"]
    tensors = {f"llm.{k}": v for k, v in target.items()}
    for k, source in ((1, 1), (2, 2)):
        for name, t in target.items():
            prefix = f"model.layers.{source}."
            if name.startswith(prefix):
                tensors[f"mtp_{k}_block.{name[len(prefix):]}"] = t + 0.01 * torch.randn(t.shape, generator=gen)
        tensors[f"mtp_{k}_proj.weight"] = torch.eye(hidden) + 0.05 * torch.randn(hidden, hidden, generator=gen)
        tensors[f"mtp_{k}_proj.bias"] = 0.01 * torch.randn(hidden, generator=gen)
        tensors[f"mtp_{k}_local_RMSNorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    out = tmp_path_factory.mktemp("llasa-plus")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def plus_heads(synth64, llasa_plus_dir, kit_dir, tmp_path_factory):
    """The modules imported by `pcg-synth draft import-llasa-plus`, loaded in float64."""
    from engine.cli import main

    out = tmp_path_factory.mktemp("imported") / "heads"
    assert main(["draft", "import-llasa-plus", "--checkpoint", str(llasa_plus_dir), "--target",
                 str(kit_dir / "target"), "--out", str(out)]) == 0
    heads = load_streams(out, synth64.target.model)
    assert isinstance(heads, LlasaPlusHeads) and heads.heads == 2
    return heads


def test_imported_modules_give_llasa_plus_logits(synth64, plus_heads, llasa_plus_dir, kit_dir):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    target = synth64.target.model
    cfg = LlamaConfig(**json.loads((kit_dir / "target" / "config.json").read_text()))
    cfg._attn_implementation = "sdpa"  # causal over the sequence, as LLaSA+ trains them
    tensors = load_file(str(llasa_plus_dir / "model.safetensors"))
    ids = torch.tensor(synth64.prompter.build(TEXTS[1]))[None]
    n = ids.shape[1]
    pos = torch.arange(n)[None]
    normed = target(ids, pos, target.new_cache(1, n), n, logits_at="normed")  # [1, n, H]
    rotary = LlamaRotaryEmbedding(cfg).double()
    z, reference = normed, []
    for k in (1, 2):
        norm = LlamaRMSNorm(cfg.hidden_size, eps=1e-6).double()
        norm.weight.data = tensors[f"mtp_{k}_local_RMSNorm.weight"].double()
        proj = torch.nn.Linear(cfg.hidden_size, cfg.hidden_size).double()
        proj.weight.data, proj.bias.data = (tensors[f"mtp_{k}_proj.{p}"].double() for p in ("weight", "bias"))
        layer = LlamaDecoderLayer(cfg, layer_idx=0).double()
        layer.load_state_dict({name[len(f"mtp_{k}_block."):]: t.double() for name, t in tensors.items()
                               if name.startswith(f"mtp_{k}_block.")})
        x = proj(norm(z))
        with torch.no_grad():
            z = layer(x, position_ids=pos, position_embeddings=rotary(x, pos))
        reference.append(z)
    ours = plus_heads.states(target, normed, pos, plus_heads.new_cache(target, 1, n), n)  # [1, n, 2, H]
    for k in range(2):  # transformers' rotary angles are float32 even in a float64 layer: close, not equal
        assert torch.allclose(plus_heads.logits(target, ours[:, :, k]), target.project(reference[k]), atol=1e-5)
    # the final norm is what LLaSA+ leaves out: with it the logits differ
    assert not torch.allclose(target.project(target.model.norm(ours[:, :, 0])), target.project(reference[0]), atol=1e-2)


def test_a_checkpoint_without_modules_or_of_another_shape_is_refused(synth64, kit_dir, tmp_path):
    target = synth64.target.model
    with pytest.raises(ValueError, match="no LLaSA\\+ multi-token modules"):
        import_llasa_plus(kit_dir / "target", target, kit_dir / "target", tmp_path / "none")
    save_file({"mtp_1_proj.weight": torch.zeros(64, 64), "mtp_1_proj.bias": torch.zeros(64)},
              str(tmp_path / "small.safetensors"))
    with pytest.raises(ValueError, match="hidden size 64 cannot run on a target of hidden size 128"):
        import_llasa_plus(tmp_path / "small.safetensors", target, kit_dir / "target", tmp_path / "small")


def test_greedy_decoding_with_llasa_plus_heads_equals_ar(synth64, plus_heads):
    rule = ExactRule()
    reqs = lambda r: [Request(key=i, prompt_ids=synth64.prompter.build(t), seed=i, max_new_tokens=32,  # noqa: E731
                              warp=Warp(0.0), rule=r) for i, t in enumerate(TEXTS)]
    target, space = synth64.target.model, synth64.layout.output_space()
    ar = {r.key: res.codes for r, res in SpeculativeDecoder(target, None, 0, 4, 512, space).run(reqs(None))}
    got = {r.key: res for r, res in SpeculativeDecoder(target, plus_heads, 2, 3, 512, space).run(reqs(rule))}
    assert {k: r.codes for k, r in got.items()} == ar
    with pytest.raises(ValueError, match="gamma 3 needs 3 stream heads; these have 2"):
        SpeculativeDecoder(target, plus_heads, 3, 3, 512, space)


def test_the_round_keeps_the_modules_caches_as_a_fresh_pass_fills_them(synth64, plus_heads):
    """Sampled rows, several rounds: after each, every active row's heads' states equal the
    modules run afresh over the target's hidden states of its committed tokens."""
    target = synth64.target.model
    decoder = SpeculativeDecoder(target, plus_heads, 2, 3, 512, synth64.layout.output_space())
    decoder.submit([Request(key=i, prompt_ids=synth64.prompter.build(t), seed=i, max_new_tokens=24, warp=Warp(1.0),
                            rule=ExactRule()) for i, t in enumerate(TEXTS[:5])])
    st, checked = decoder.state, 0
    while not decoder.idle:
        decoder.advance()
        for slot in decoder.owner:
            n = int(st.seq_len[slot])
            ids, pos = st.tokens[slot, :n - 1][None], torch.arange(n - 1)[None]
            normed = target(ids, pos, target.new_cache(1, n), n, logits_at="normed")
            fresh = plus_heads.states(target, normed, pos, plus_heads.new_cache(target, 1, n), n)[0, -1]
            assert torch.allclose(st.stream_state[slot], fresh, atol=1e-9), (slot, n)
            checked += 1
    assert checked > 10


def test_the_forward_clock_times_the_modules_passes_and_lets_them_go(synth64, plus_heads):
    """The `gamma: auto` pilot counts a round's pass of attending heads (`states`) as forward
    time, not host time, and leaves the heads' own methods in place afterwards."""
    from engine.decoding.cost import ForwardClock

    target = synth64.target.model
    decoder = SpeculativeDecoder(target, plus_heads, 2, 2, 256, synth64.layout.output_space())
    decoder.submit([Request(key=0, prompt_ids=synth64.prompter.build(TEXTS[0]), seed=0, max_new_tokens=8,
                            warp=Warp(0.0), rule=ExactRule())])
    with ForwardClock(target, plus_heads) as clock:
        assert "states" in vars(plus_heads)  # the clock's timed pass stands in for the method
        while not decoder.idle:
            decoder.advance()
    assert clock.decode_s > 0
    assert "states" not in vars(plus_heads) and "logits" not in vars(plus_heads)


def test_the_dry_runs_sizing_counts_the_modules_caches(plus_heads, kit_dir):
    """The dry run sizes imported modules with their keys and values: one layer of the target's
    attention shape a module, every position of every row, and read once a round."""
    from engine.decoding.sizing import LMSize, StreamsSize, Worker
    from engine.families import FAMILIES
    from engine.models.streams import read_streams_info

    target = LMSize.from_config(json.loads((kit_dir / "target" / "config.json").read_text()))
    heads = StreamsSize.from_info(read_streams_info(plus_heads.path))
    assert heads.attends and heads.heads == 2
    llasa = FAMILIES["llasa"]
    alone, with_heads = Worker(llasa, target, None, 4, 2), Worker(llasa, target, None, 4, 2, streams=heads)
    layer = 2 * target.kv_heads * target.head_dim * 2  # one layer's keys and values a position, bfloat16
    assert with_heads.kv_per_row() - alone.kv_per_row() == 2 * layer * with_heads.positions
    read = with_heads.round_bytes() - alone.round_bytes()
    assert read == (heads.parameters + llasa.output_ids * target.hidden) * 2 + 2 * layer * 4 * with_heads.positions
    ar = Worker(llasa, target, None, 4, 0)
    assert Worker(llasa, target, None, 4, 0, streams=heads).kv_per_row() == ar.kv_per_row()  # `ar`: no modules
