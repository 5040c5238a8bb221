"""A decode round as one compiled graph (inductor on the CPU): no graph break for any rule mix,
the eager round's tokens for every rule, greedy and sampled, across admissions and key buckets,
PCG's exact fallback after the round, and a second process that loads the compiled round from the
on-disk cache instead of compiling it; the round as a GPU runs it, on the meta device (no read-back,
no host-made tensor, one graph).

The models are the kit's target and draft cut to their first layer (`init_draft`): a round's code
is the same for any number of layers, and inductor's work grows with them. Tokens are compared in
float64, where the two paths agree bit for bit; in float32 or bfloat16 a fused kernel may round a
probability differently in its last bit, which can move a draw that lands on a boundary (the same
law, not the same bits: `docs/concepts/architecture.md`)."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.config import JobSpec
from engine.decoding import graphs, rng
from engine.decoding.round import RoundPlan, decode_round
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import Block, ExactRule, PCGRule, SSDRule, TopKRule
from engine.groups.csr import GroupIndex
from engine.knobs import SamplingSteps
from engine.models.device import CPU_AUTO_COMPILE, resolve_compile

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog.", "Call Stella and ask her to bring these things.",
         "One, two, three.", "Hong Kong and Paris are far apart.", "A sixth row."]


@pytest.fixture(scope="module")
def small_kit(kit_dir, tmp_path_factory):
    """The kit's target and draft, each cut to layer 0."""
    from engine.draft.init import init_draft

    out = tmp_path_factory.mktemp("compile")
    init_draft(kit_dir / "target", out / "target", layers=[0])
    init_draft(kit_dir / "target", out / "draft", layers=[0])
    return out


def load(small_kit, kit_groups, compile: str, dtype: str = "float64") -> Synthesizer:
    synth = Synthesizer.load(small_kit / "target", draft=small_kit / "draft", device="cpu", dtype=dtype,
                             batch_size=4, compile=compile)
    synth.set_groups(kit_groups)
    return synth


def mixed_rows(synth: Synthesizer, n: int = 10) -> list[tuple[DecodingSettings, Request]]:
    """Rows of every rule, greedy and sampled, with and without a penalty, top-p and top-k."""
    methods = ["exact", "pcg", "ssd", "topk"]
    rows = []
    for i in range(n):
        over = {"method": methods[i % 4], "gamma": 3, "seed": 7, "max_new_tokens": 20 + 9 * (i % 5)}
        if i % 3 == 0:
            over["temperature"] = 0.0
        else:
            over.update(repetition_penalty=1.3 if i % 2 else 1.0, top_p=0.9 if i % 4 == 1 else 1.0,
                        top_k=40 if i % 5 == 2 else 0)
        settings = DecodingSettings(**over)
        rows.append((settings, synth.prepare(i, TEXTS[i % len(TEXTS)], settings)[1]))
    return rows


def decode_mixed(synth: Synthesizer) -> tuple[dict, int]:
    """Codes by row of `mixed_rows` decoded together at batch 4, and the rounds it took."""
    session = synth.session(4)
    session.submit(mixed_rows(synth))
    codes = {}
    while not session.idle:
        for request, row in session.step():
            codes[request.key] = row.codes
    return codes, session.scheduler.rounds


MIXES = [("ar", ()), ("exact", ("exact",)), ("pcg", ("pcg",)), ("ssd", ("ssd",)), ("topk", ("topk",)),
         ("all", ("exact", "pcg", "ssd", "topk"))]


def admitted(synth: Synthesizer, mix: tuple[str, ...]) -> tuple[SpeculativeDecoder, RoundPlan]:
    """A decoder of 4 rows of the rules in `mix` (none: `ar`), greedy and sampled with top-k, top-p
    and a penalty, after one eager `advance` (admission and a round), and its next round's plan."""
    groups = synth.groups(0.4)
    rules = {"exact": ExactRule(), "pcg": PCGRule(groups, 4), "ssd": SSDRule(0.3), "topk": TopKRule(20)}
    gamma = 0 if not mix else 2
    decoder = SpeculativeDecoder(synth.target.model, synth.draft.model if gamma else None, gamma, 4, 256,
                                 synth.layout.output_space())
    prompt = synth.prompter.build("Hello there.")
    warps = [DecodingSettings(temperature=0).warp,
             DecodingSettings(temperature=0.8, top_p=0.9, top_k=30, repetition_penalty=1.2).warp]
    decoder.submit([Request(key=i, prompt_ids=prompt, seed=i, max_new_tokens=8, warp=warps[i % 2],
                            rule=rules[mix[i % len(mix)]] if mix else None) for i in range(4)])
    decoder.advance()  # admits the rows and runs one eager round
    plan = decoder.plan(sorted(decoder.owner))
    assert plan.steps == SamplingSteps(sampled=True, greedy=True, penalty=True, top_p=True, max_top_k=30)
    assert len(plan.rules) == len(mix)
    return decoder, plan


def test_a_round_traces_as_one_graph_for_each_rule_mix(small_kit, kit_groups):
    """`fullgraph=True` refuses any graph break: each plan below traces whole (dynamo's tracing
    alone, the `eager` backend: no code generated)."""
    synth = load(small_kit, kit_groups, "none", dtype="float32")
    for name, mix in MIXES:
        decoder, plan = admitted(synth, mix)
        torch._dynamo.reset()
        traced = torch.compile(lambda state, plan=plan: decode_round(state, plan), backend="eager", fullgraph=True)
        with torch.no_grad():
            out = traced(decoder.state)
        assert out.shape == (4, 3), name


def on_meta(obj, memo: dict):
    """A copy of `obj` (a decoder's state or a plan, with the models, caches and groups they hold)
    whose tensors are on the meta device: shapes, dtypes and strides, no values. `memo` keeps each
    original beside its copy: a temporary (a parameter's `.data`, a slice) freed while the memo
    lives could hand its id to another object, which would then get the wrong copy."""
    hit = memo.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    if isinstance(obj, torch.nn.Parameter):
        out = torch.nn.Parameter(on_meta(obj.data, memo), requires_grad=False)
    elif isinstance(obj, torch.Tensor):
        out = torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device="meta")
    elif isinstance(obj, (list, tuple)):
        out = type(obj)(on_meta(v, memo) for v in obj)
    elif isinstance(obj, dict):
        out = {k: on_meta(v, memo) for k, v in obj.items()}
    elif isinstance(obj, torch.nn.Module) or type(obj).__module__.startswith("engine."):
        out = copy.copy(obj)
        for k, v in vars(obj).items():
            object.__setattr__(out, k, on_meta(v, memo))  # frozen dataclasses too
    else:
        out = obj
    memo[id(obj)] = (obj, out)
    return out


def test_the_round_a_gpu_runs_reads_nothing_back_and_makes_no_host_tensor(small_kit, kit_groups):
    """A device-less check of the round as a GPU runs it, for each rule mix: the decoder's state,
    the models and the plan moved to the meta device (tensors without values), with CUDA's
    attention (`grouped_attention`), and off the CPU top-p sorts (`nucleus_sorted`). A read-back
    inside the round (`.item()`, `bool(t)`, `nonzero`, a boolean mask) raises on meta tensors, and so
    does a tensor made on the host without the state's device; then the round traces whole at the
    key count that `RoundRunner` marks dynamic. What it cannot check: kernels, CUDA graph capture,
    numbers (tests/gpu do, on a GPU)."""
    from engine.models.loading import load_model

    target = load_model(small_kit / "target", "cpu", "bfloat16", prepack=False)  # what a GPU holds
    synth = Synthesizer(target, load_model(small_kit / "draft", "cpu", "bfloat16", tokenizer=target.tokenizer,
                                           prepack=False), batch_size=4)
    synth.set_groups(kit_groups)
    for name, mix in MIXES:
        decoder, plan = admitted(synth, mix)
        memo: dict = {}
        keys_read = on_meta(decoder.keys_read[: plan.kv_len], memo)  # the bucket, as `RoundRunner.round`
        state, plan = on_meta(decoder.state, memo), on_meta(replace(plan, kv_len=0), memo)
        for model in (state.target, state.draft):
            if model is not None:
                assert model.head.device.type == "meta" and model.packed_head is None
                model.attention = "grouped"  # what `auto` takes on CUDA
        with torch.no_grad():
            out = decode_round(state, plan, keys_read)
        assert out.shape == (4, 3) and out.device.type == "meta", name
        torch._dynamo.reset()
        traced = torch.compile(lambda s, k, plan=plan: decode_round(s, plan, k), backend="eager", fullgraph=True)
        torch._dynamo.mark_dynamic(keys_read, 0)
        with torch.no_grad():
            assert traced(state, keys_read).shape == (4, 3), name


def test_the_compiled_round_gives_the_eager_tokens(small_kit, kit_groups, caplog, monkeypatch):
    eager = load(small_kit, kit_groups, "none")
    compiled = load(small_kit, kit_groups, "inductor")
    assert compiled.runner.mode == "inductor" and compiled.target.model.compile_mode == "inductor"
    ref, _ = decode_mixed(eager)
    # the suite runs under OMP_WAIT_POLICY=PASSIVE (conftest): a CPU round's first compile says what it costs
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(graphs, "_warned_passive", False)
    with caplog.at_level(logging.WARNING, logger="engine.decoding.graphs"):
        out, rounds = decode_mixed(compiled)
    assert len([r for r in caplog.records if "OMP_WAIT_POLICY=PASSIVE" in r.message]) == 1
    assert not graphs.warn_passive_openmp()  # once per process
    assert out == ref and len(out) == 10 and all(out.values())
    stats = compiled.runner.stats
    assert stats.compiles == 1 and stats.graph_launches == rounds  # one graph: every row, every bucket
    assert max(len(c) for c in out.values()) + len(compiled.prompter.build(TEXTS[2])) > 64  # crossed one
    assert rounds > 10 // 4 * 2  # rows were admitted while others decoded
    ar = [SynthesisItem(text=t, id=str(i), temperature=0.0 if i % 2 else 0.8) for i, t in enumerate(TEXTS)]
    ar_settings = DecodingSettings(method="ar", max_new_tokens=30, seed=3)
    assert [r.codes for r in compiled.synthesize(ar, ar_settings)[0]] == \
        [r.codes for r in eager.synthesize(ar, ar_settings)[0]]
    assert compiled.runner.stats.compiles == 2


def test_the_compiled_round_with_frame_masks_gives_the_eager_tokens(orpheus_kit_dir, tmp_path):
    """The Orpheus kit (cut to layer 0): the frame masks inside the compiled round, one graph for
    every rule mix, the eager round's codes, every row whole frames of codes in range."""
    from engine.draft.init import init_draft

    for part in ("target", "draft"):
        init_draft(orpheus_kit_dir / "target", tmp_path / part, layers=[0])
    synths = [Synthesizer.load(tmp_path / "target", draft=tmp_path / "draft", device="cpu", dtype="float64",
                               batch_size=4, compile=mode) for mode in ("none", "inductor")]
    for synth in synths:
        synth.groups(0.4)
    (ref, _), (out, rounds) = decode_mixed(synths[0]), decode_mixed(synths[1])
    assert out == ref and len(out) == 10
    assert all(len(c) % 7 == 0 and all(0 <= x < 4096 for x in c) for c in out.values())
    assert synths[1].runner.stats.compiles == 1 and synths[1].runner.stats.graph_launches == rounds


def test_pcg_rows_whose_thinning_fails_get_the_exact_fallback_after_the_round(small_kit, kit_groups, kit_synth):
    """With one thinning trial most rejected PCG rows need the dense residual: the round leaves
    them to the decoder, which draws exactly what the rule itself draws on the same block."""
    synth = load(small_kit, kit_groups, "none")
    groups = synth.groups(0.4)
    rule = PCGRule(groups, max_trials=1)
    gen = torch.Generator().manual_seed(0)
    b, g, v = 64, 3, synth.target.model.vocab_out
    draft = torch.softmax(2 * torch.randn(b, g, v, generator=gen), -1)
    target = torch.softmax(2 * torch.randn(b, g + 1, v, generator=gen), -1)
    seeds, pos = torch.arange(b), torch.full((b,), 40)
    keys = rng.seed_key(seeds)
    tokens = torch.multinomial(draft.view(-1, v), 1, generator=gen).view(b, g)
    block = Block(tokens, draft, target, None, seeds, pos)
    whole = rule.judge(block)
    left = rule.judge(block, dense_fallback=False)
    due = left.fallback & (left.num_accepted < g)
    assert int(due.sum()) > 5  # the test has cases
    slot = left.num_accepted.clamp(max=g - 1)
    rows = torch.arange(b)
    fixed, _ = rule.exact_residual(target[rows, slot], draft[rows, slot], keys, pos + slot)
    assert torch.equal(torch.where(due, fixed, left.next_token), whole.next_token)
    settings = DecodingSettings(method="pcg", gamma=3, max_thinning_trials=1, max_new_tokens=40)
    kit_synth.set_groups(kit_groups)  # the kit's own draft: rejections happen
    results, summary = kit_synth.synthesize(TEXTS, settings)
    decoder = kit_synth.decoder(settings, 4)
    assert summary.stats.fallbacks > 0 and decoder.fallbacks_fixed > 0
    assert all(r.codes and all(0 <= c < 65536 for c in r.codes) for r in results)


def test_a_second_process_loads_the_compiled_round_from_the_cache(small_kit, kit_groups, tmp_path):
    """Inductor's on-disk cache (under `$PCG_SYNTH_CACHE/inductor`) serves a second process: it
    traces the round again but does not compile it."""
    script = tmp_path / "second.py"
    script.write_text(
        "import json, sys\n"
        "from engine import DecodingSettings, Synthesizer\n"
        "from engine.groups.cache import get_groups\n"
        "from engine.groups.options import GroupsBuild\n"
        "s = Synthesizer.load(sys.argv[1] + '/target', draft=sys.argv[1] + '/draft', device='cpu',\n"
        "                     dtype='float64', batch_size=4, compile='inductor')\n"
        "s.set_groups(get_groups(s.speech_embeddings(), GroupsBuild(0.4)))\n"
        "s.synthesize(['Hi.', 'Hello there.'], DecodingSettings(method='exact', gamma=2, max_new_tokens=12))\n"
        "print(json.dumps(s.runner.stats.to_dict()))\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    runs = [json.loads(subprocess.run([sys.executable, str(script), str(small_kit)], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["compiles"] == runs[1]["compiles"] == 1
    assert runs[1]["cache_hits"] == 1  # the second process found the first one's code


def test_a_round_whose_graph_does_not_compile_runs_eagerly_under_auto_and_fails_when_asked(small_kit, tmp_path):
    """Under `compile: auto` a round whose graph fails to compile (here for real: inductor is given
    no working C++ compiler, in a fresh compile cache) runs eagerly, warned and recorded, and gives
    the eager tokens; an explicit `inductor` makes it an error. Auto is eager on a CPU, so the
    script makes it mean inductor, as it means CUDA graphs on a GPU."""
    script = tmp_path / "fallback.py"
    script.write_text(
        "import json, logging, sys\n"
        "import torch._inductor.config as config\n"
        "import engine.models.device as device\n"
        "from engine import DecodingSettings, Synthesizer\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "config.cpp.cxx = ('/nonexistent/c++',)\n"
        "device.CPU_AUTO_COMPILE = 'inductor'\n"
        "kit, texts = sys.argv[1], ['Hi.', 'Hello there.']\n"
        "settings = DecodingSettings(method='exact', gamma=2, max_new_tokens=12, seed=5)\n"
        "def load(compile):\n"
        "    return Synthesizer.load(kit + '/target', draft=kit + '/draft', device='cpu', dtype='float64',\n"
        "                            batch_size=2, compile=compile)\n"
        "eager = [r.codes for r in load('none').synthesize(texts, settings)[0]]\n"
        "auto = load('auto')\n"
        "codes = [r.codes for r in auto.synthesize(texts, settings)[0]]\n"
        "try:\n"
        "    load('inductor').synthesize(texts, settings)\n"
        "    strict = 'ran'\n"
        "except Exception as exc:\n"
        "    strict = type(exc).__name__\n"
        "print(json.dumps({'same': codes == eager, 'stats': auto.runner.stats.to_dict(), 'strict': strict}))\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, str(script), str(small_kit)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["same"] and out["strict"] == "InductorError"
    stats = out["stats"]
    assert stats["mode"] == "none" and stats["compiles"] == 1 and stats["graph_launches"] == 0
    assert stats["rounds"] > 0 and "C++ compiler" in stats["compile_failed"]
    assert done.stderr.count("decode rounds run eagerly: a round's graph did not compile") == 1


def test_a_jobs_summary_says_which_workers_rounds_fell_back_to_eager():
    from engine.runtime.commits import CommitRecord
    from engine.runtime.summary import round_figures

    def record(worker, mode, failed=None):
        stats = graphs.RoundStats(mode=mode, rounds=10, host_s=0.1, compiles=1, compile_failed=failed).to_dict()
        return CommitRecord(shard=f"shard-{worker}", rows=1, ok=1, failed=0, audio_seconds=1.0, generated_tokens=10,
                            rounds=10, emitted=10, reached=[], accepted=[], thinning_trials=0, wall_s=1.0,
                            worker=worker, round_stats=stats)
    records = [record("w0", "inductor"), record("w1", "none", "InductorError: no C++ compiler")]
    figures = round_figures(records)
    assert figures["modes"] == ["inductor", "none"] and figures["rounds"] == 20
    assert figures["compile_failed"] == ["InductorError: no C++ compiler"]
    assert round_figures(records[:1])["compile_failed"] == []


def test_compile_settings_are_checked(small_kit):
    from engine.models.loading import load_model

    model = load_model(small_kit / "target", "cpu", "float32").model
    with pytest.raises(ValueError, match="cudagraphs needs a CUDA device"):
        model.set_compile_mode("cudagraphs")
    with pytest.raises(ValueError, match="compile must be one of none, inductor, cudagraphs"):
        model.set_compile_mode("max")
    models = {"target": "t", "draft": "d", "codec": "c"}
    spec = {"name": "j", "input": {"manifests": ["m.jsonl"]}, "output": {"uri": "out"}, "models": models}
    assert JobSpec.model_validate(spec).models.compile == "auto"  # the default
    with pytest.raises(ValueError, match="compile"):
        JobSpec.model_validate({**spec, "models": {**models, "compile": "fast"}})
    with pytest.raises(ValueError, match="int8 runs eagerly"):
        JobSpec.model_validate({**spec, "models": {**models, "compile": "inductor", "draft_weights": "int8"}})
    assert resolve_compile("auto", "cpu") == CPU_AUTO_COMPILE and resolve_compile("auto", "cpu", "int8") == "none"
    assert resolve_compile("auto", "cuda") == "cudagraphs" and resolve_compile("inductor", "cuda") == "inductor"
    groups = GroupIndex.__new__(GroupIndex)  # a plan names its rules; none is run here
    assert RoundPlan(3, (PCGRule(groups, 5),), SamplingSteps(sampled=True), 64).trials == 5


@pytest.mark.parametrize("max_trials", [1])
def test_the_laws_hold_through_a_compiled_judge(max_trials):
    """The Monte-Carlo checks of tests/cpu/test_verify_math.py through the compiled path: a judge
    compiled with `fullgraph=True` and the fallback drawn after it, as a decoder's round does. One
    thinning trial leaves many rows to the fallback; PCG's emitted group label follows the target's
    coarse law and `exact`'s token the target's law."""
    from scipy.stats import chisquare

    from engine.decoding.sampling import sample_one
    from engine.groups.build import build_groups

    gen = torch.Generator().manual_seed(0)
    v_speech, v = 12, 13
    groups = GroupIndex(build_groups(torch.randn(v_speech, 3, generator=gen), 0.75), v)
    draft = torch.softmax(1.5 * torch.randn(v, generator=gen, dtype=torch.float64), -1).float()
    target = torch.softmax(1.5 * torch.randn(v, generator=gen, dtype=torch.float64), -1).float()
    trials = 100_000
    seeds, pos = torch.arange(trials), torch.zeros(trials, dtype=torch.long)
    keys = rng.seed_key(seeds)
    draft_probs, target_probs = draft.expand(trials, 1, v).contiguous(), target.expand(trials, 2, v).contiguous()
    tokens = sample_one(draft_probs, rng.keyed_uniform(keys[:, None], pos[:, None], rng.DRAFT))
    block = Block(tokens, draft_probs, target_probs, None, None, pos, keys=keys)

    def law_fit(observed, law) -> float:
        law = np.asarray(law, dtype=np.float64)
        return chisquare(observed, law / law.sum() * observed.sum()).pvalue

    pcg = PCGRule(groups, max_trials=max_trials)
    verdict = torch.compile(lambda b: pcg.judge(b, dense_fallback=False), fullgraph=True)(block)
    due = verdict.fallback & (verdict.num_accepted == 0)
    assert int(due.sum()) > 1000  # the fallback is exercised
    token, label = pcg.exact_residual(target_probs[:, 0], draft_probs[:, 0], keys, pos)
    labels = torch.where(due, label, verdict.labels[:, 0])
    coarse = groups.all_masses(target[None].double())[0].numpy()
    assert law_fit(np.bincount(labels.numpy(), minlength=groups.num_groups), coarse) > 1e-3
    emitted = torch.where(verdict.num_accepted > 0, tokens[:, 0], torch.where(due, token, verdict.next_token))
    assert bool(groups.contains(labels, emitted).all())

    exact = torch.compile(lambda b: ExactRule().judge(b, dense_fallback=False), fullgraph=True)(block)
    emitted = torch.where(exact.num_accepted > 0, tokens[:, 0], exact.next_token)
    assert law_fit(np.bincount(emitted.numpy(), minlength=v), target.double().numpy()) > 1e-3


def test_the_eager_round_dispatches_no_more_ops_than_its_ceiling(kit_dir, kit_groups):
    """Ops dispatched by one eager round of 32 sampled rows on the kit (the count
    `benchmarks/bench_round.py` reports) stay within a ceiling per method: every op is a dispatch
    an eager round pays on the host. The count does not depend on the machine, so a change that
    adds ops to every round fails here rather than only in a benchmark."""
    synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu", dtype="bfloat16",
                             batch_size=32, compile="none")
    synth.set_groups(kit_groups)
    counted = {}
    for method, ceiling in (("ar", 184), ("pcg", 801)):
        settings = DecodingSettings(method=method, gamma=3, max_new_tokens=64, seed=1)
        decoder = synth.make_decoder(settings, 32)
        rule = synth.rule(settings)
        requests = [synth.prepare(i, TEXTS[i % len(TEXTS)], settings)[1] for i in range(32)]
        for request in requests:
            request.rule = rule
        decoder.submit(requests)
        synth.runner.stats.ops_per_round = 0
        for _ in range(3):  # a plan's second round is counted
            decoder.advance()
        counted[method] = synth.runner.stats.ops_per_round
        assert 0 < counted[method] <= ceiling, counted
    assert counted["pcg"] > 2 * counted["ar"]  # the draft's three steps and the judge are counted too


def test_a_rounds_step_tables_are_each_steps_own(kit_synth):
    """The mask and rope tables a round makes once for every position it feeds give each step
    exactly the tables the step would make itself; a draft whose rope differs gets its own."""
    target, draft = kit_synth.target.model, kit_synth.draft.model
    assert target.same_rope(draft)
    span = torch.tensor([[5, 6, 7, 8, 9], [40, 41, 42, 43, 44]])
    tables = target.step_tables(span, 64)
    for start, stop in ((0, 2), (2, 3), (1, 5)):
        own = target.step_tables(span[:, start:stop], 64)
        assert all(torch.equal(a, b) for a, b in zip(tables.columns(start, stop), own))
    original = draft.rope_scaling
    try:
        draft.rope_scaling = 2.0
        assert not target.same_rope(draft)
        settings = DecodingSettings(method="exact", gamma=3, max_new_tokens=8, seed=1)
        decoder = kit_synth.make_decoder(settings, 2)
        assert not decoder.state.same_rope
        _, request = kit_synth.prepare(0, "Hi.", settings)
        request.rule = kit_synth.rule(settings)
        decoder.submit([request])
        before = int(decoder.state.seq_len.max())
        decoder.advance()  # the admission's prefill, then rounds: the target makes its own tables
        decoder.advance()
        assert int(decoder.state.seq_len.max()) > before
    finally:
        draft.rope_scaling = original
