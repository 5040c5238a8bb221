"""CUDA paths (skipped without a GPU): decoding, parity with the CPU, codec, groups backends; the
two CUDA-graph tests last, since they compile (a time limit that stops them leaves the others run)."""

from __future__ import annotations

import numpy as np
import torch

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.codec.xcodec2 import Xcodec2Codec
from engine.groups.build import build_groups

TEXTS = ["Hi.", "The quick brown fox jumps over the lazy dog.", "Call Stella.", "Hong Kong and Paris."]


def test_greedy_speculative_equals_greedy_target_on_cuda(kit_dir):
    synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cuda", dtype="float32",
                             compile="none")
    ar, _ = synth.synthesize(TEXTS, DecodingSettings(method="ar", temperature=0, max_new_tokens=24), batch_size=1)
    spec, summary = synth.synthesize(TEXTS, DecodingSettings(method="exact", temperature=0, max_new_tokens=24),
                                     batch_size=3)
    assert [r.codes for r in spec] == [r.codes for r in ar]
    assert summary.stats.drafted > 0


def test_cuda_logits_match_cpu(kit_dir):
    from engine.models.loading import load_model

    cpu = load_model(kit_dir / "target", device="cpu", dtype="float32").model
    gpu = load_model(kit_dir / "target", device="cuda", dtype="float32").model
    ids = torch.arange(700, 740)[None]
    pos = torch.arange(40)[None]
    ref = cpu(ids, pos, cpu.new_cache(1, 64), 64)
    out = gpu(ids.cuda(), pos.cuda(), gpu.new_cache(1, 64), 64).cpu()
    assert torch.allclose(out, ref, atol=2e-3, rtol=2e-3)


def test_cuda_attention_is_grouped_with_no_per_shape_setup(kit_dir):
    """On CUDA a forward attends with `grouped_attention`, not torch's SDPA (whose cuDNN kernel,
    first on Hopper, builds a graph per new shape): no SDPA op in bfloat16 steps at growing key
    lengths (its logits against the CPU's SDPA: `test_cuda_logits_match_cpu`)."""
    from engine.models.loading import load_model

    model = load_model(kit_dir / "target", device="cuda", dtype="bfloat16").model
    cache = model.new_cache(2, 96)
    model(torch.arange(700, 740, device="cuda").expand(2, -1), torch.arange(40, device="cuda").expand(2, -1),
          cache, 40, logits_at="none")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for n in range(40, 48):
            tokens, pos = torch.full((2, 1), 800 + n, device="cuda"), torch.full((2, 1), n, device="cuda")
            logits = model(tokens, pos, cache, n + 1)
    assert logits.shape == (2, 1, model.vocab_out) and torch.isfinite(logits).all()
    assert not [e.name for e in prof.events() if "attention" in e.name], "a torch attention op ran"


def test_sampled_pcg_runs_in_bfloat16(kit_dir):
    synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cuda", dtype="bfloat16",
                             compile="none")
    results, summary = synth.synthesize(TEXTS, DecodingSettings(method="pcg", max_new_tokens=32), batch_size=4)
    assert all(r.finish_reason in ("eos", "length") and r.codes for r in results)
    assert 0 < sum(summary.stats.accepted) <= summary.stats.drafted


def test_codec_decodes_on_cuda_like_cpu(kit_dir):
    codes = [list(np.random.default_rng(0).integers(0, 65536, 50))] * 2
    cpu = Xcodec2Codec.load(kit_dir / "codec", device="cpu", dtype="float32").decode(codes)
    gpu = Xcodec2Codec.load(kit_dir / "codec", device="cuda", dtype="float32").decode(codes)
    for a, b in zip(cpu, gpu):
        assert a.shape == b.shape == (50 * 320,)
        assert np.abs(a - b).max() < 1e-3


def test_groups_on_cuda_equal_faiss_cpu():
    emb = torch.randn(3000, 32, generator=torch.Generator().manual_seed(0))
    ref = build_groups(emb, 0.5, backend="faiss", device="cpu")
    gpu = build_groups(emb, 0.5, backend="torch", device="cuda")
    assert np.array_equal(ref.indptr, gpu.indptr) and np.array_equal(ref.members, gpu.members)


def test_groups_builder_chooses_faiss_gpu_where_a_faiss_gpu_build_sees_the_gpu():
    """With the [gpu] extra (faiss-gpu) on a CUDA machine the builder picks the faiss GPU backend,
    and its groups equal faiss-cpu's."""
    import pytest

    from engine.groups.search import faiss_gpu_available, resolve_backend

    if not faiss_gpu_available():
        pytest.skip("no faiss GPU build here (pip install 'pcg-synth[gpu]')")
    assert resolve_backend("auto", torch.device("cuda")) == "faiss-gpu"
    emb = torch.randn(3000, 32, generator=torch.Generator().manual_seed(1))
    gpu = build_groups(emb, 0.5, backend="auto", device="cuda")
    ref = build_groups(emb, 0.5, backend="faiss", device="cpu")
    assert gpu.meta["backend"] == "faiss-gpu" and ref.meta["backend"] == "faiss-cpu"
    assert np.array_equal(ref.indptr, gpu.indptr) and np.array_equal(ref.members, gpu.members)


def test_a_decode_loop_profile_on_cuda_has_device_time_and_runtime_calls(kit_dir):
    """`profile.rounds` on a GPU: the kernels' device time and the CUDA runtime calls (launches,
    the round's sync) per round, besides the host's ops."""
    from engine.runtime.profiling import RoundProfiler

    synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cuda", dtype="bfloat16",
                             compile="none")
    settings = DecodingSettings(method="pcg", max_new_tokens=32)
    session = synth.session(4)
    session.submit([(settings, synth.prepare(i, text, settings)[1]) for i, text in enumerate(TEXTS)])
    profiler = RoundProfiler(5, skip=1, device="cuda")
    while not session.idle:
        with profiler.round():
            session.step()
    profiler.finish()
    profile = profiler.take()
    assert profile["rounds"] == 5 and profile["device_ms_per_round"] > 0
    calls = profile["cuda_runtime_per_round"]
    assert any("Launch" in name and c["calls"] >= 1 for name, c in calls.items())
    assert profile["in_torch_ops_ms_per_round"] <= profile["round_ms"]["mean"]


def test_random_draws_on_cuda_do_not_wait_for_the_device():
    """A decode round draws a dozen times; a draw that copied its int lane to the device would
    wait for the copy each time. Draws from a row's seed key with host-side ints queue no sync."""
    from engine.decoding import rng
    from engine.decoding.verify import Block

    seeds = torch.tensor([3, 2**40 + 7], device="cuda")
    pos = torch.tensor([10, 20], device="cuda")
    key = rng.seed_key(seeds)
    block = Block(torch.zeros(2, 3, dtype=torch.long, device="cuda"), None, None, None, seeds, pos, keys=key)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        u = rng.keyed_uniform(key, pos, rng.BONUS)
        v = block.uniform(rng.BONUS, 3)
        w = block.uniform(rng.RECOVER, pos - pos, lanes=4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(u.cpu(), rng.uniform(seeds.cpu(), pos.cpu(), rng.BONUS))
    assert torch.equal(v.cpu(), rng.uniform(seeds.cpu(), pos.cpu() + 3, rng.BONUS))
    assert w.shape == (2, 4)


def test_a_cuda_graph_round_gives_the_eager_tokens_without_a_host_sync(kit_dir, kit_groups, tmp_path):
    """Each round one CUDA graph replay (compile auto on CUDA), the eager round's tokens for
    greedy and sampled rows of several rules (float64: the two paths agree bit for bit), and no
    host sync inside a round (`set_sync_debug_mode("error")` around every replay)."""
    from engine.draft.init import init_draft

    # two layers and one: a round's code is the same as the kit's, its compile shorter
    init_draft(kit_dir / "target", tmp_path / "target", layers=[0, 3])
    init_draft(kit_dir / "target", tmp_path / "draft", layers=[0])
    load = lambda mode: Synthesizer.load(tmp_path / "target", draft=tmp_path / "draft", device="cuda",  # noqa: E731
                                         dtype="float64", batch_size=4, compile=mode)
    eager, graphs = load("none"), load("auto")
    assert graphs.runner.mode == "cudagraphs"
    graphs.runner.sync_check = True
    for synth in (eager, graphs):
        synth.set_groups(kit_groups)
    items = [SynthesisItem(text=t, id=str(i), temperature=0.0 if i % 2 else 0.8) for i, t in enumerate(TEXTS * 2)]
    for method in ("pcg", "exact", "ar"):
        settings = DecodingSettings(method=method, max_new_tokens=40, seed=9)
        ref, _ = eager.synthesize(items, settings)
        out, summary = graphs.synthesize(items, settings)
        assert [r.codes for r in out] == [r.codes for r in ref] and all(r.codes for r in out), method
    stats = graphs.runner.stats
    assert stats.compiles == 3 and stats.graph_launches == stats.rounds > 0


def test_a_cuda_graph_worker_records_its_graphs_on_its_decode_thread(kit_dir, tmp_path):
    from torch._inductor import cudagraph_trees

    from engine.config import JobSpec
    from engine.runtime.worker import ShardProcessor

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(f'{{"id": "r{i}", "text": "{t}"}}\n' for i, t in enumerate(TEXTS)))
    spec = JobSpec.model_validate({
        "name": "graphs", "models": {"target": str(kit_dir / "target"), "draft": str(kit_dir / "draft"),
                                     "codec": str(kit_dir / "codec"), "compile": "cudagraphs"},
        "decoding": {"method": "exact", "temperature": 0, "max_new_tokens": 12},
        "input": {"manifests": [str(manifest)]}, "output": {"uri": str(tmp_path / "out")},
        "resources": {"workers": 1, "batch_size": 2, "rows_per_shard": 2, "device": "cuda", "gpus_per_worker": 1}})
    processor = ShardProcessor(spec)
    try:
        processor.warmup()
        index = torch.device(processor.device).index or 0
        manager = processor.stream.on_decode_thread(lambda: cudagraph_trees.get_manager(index, False)).result()
        # the graphs the job's rounds replay were recorded by the warm-up, on the decode thread
        assert manager is not None and cudagraph_trees.get_manager(index, False) is None
        # a kept worker's next job (a sweep's next point) decodes on the same thread: same graphs
        processor = processor.reuse(spec.model_copy(update={
            "output": spec.output.model_copy(update={"uri": str(tmp_path / "next")})}))
        processor.warmup()
        assert processor.stream.on_decode_thread(lambda: cudagraph_trees.get_manager(index, False)).result() is manager
    finally:
        processor.close()
