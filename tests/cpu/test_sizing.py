"""Sizing (`engine/decoding/sizing.py`, the dry run's `engine/runtime/sizing.py`, docs/sizing.md):
the memory model counts what the engine allocates, the page is what the code computes, the dry run
of the README's example spec prints the page's lines, and a spec that does not fit is warned of.
The README's checkpoints are stood in for by folders holding their published config.json and a
Llasa token table: a dry run reads nothing else of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from engine.cli import main
from engine.decoding.sizing import GB, GPUS, LMSize, Worker, gpu_named, gpu_of_device
from engine.families import FAMILIES
from engine.families.llasa import SPEECH_END, SPEECH_START, TEXT_END, TEXT_START, speech_token
from engine.runtime.sizing import sizing_lines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import sizing_page  # noqa: E402

LLASA, ORPHEUS = FAMILIES["llasa"], FAMILIES["orpheus"]


def test_the_page_is_what_the_code_computes():
    page = sizing_page.PAGE.read_text()
    assert sizing_page.render(page) == page, "docs/sizing.md is stale: run python scripts/sizing_page.py"
    assert page.count("<!-- sizing: ") == len(sizing_page.BLOCKS)


def llasa_tokens() -> bytes:
    """A tokenizer.json holding Llasa's control and speech tokens at the released ids."""
    added = [{"content": t, "id": 128258 + i} for i, t in enumerate((TEXT_START, TEXT_END, SPEECH_START, SPEECH_END))]
    added += [{"content": speech_token(c), "id": 128264 + c} for c in range(LLASA.codebook)]
    return json.dumps({"model": {"vocab": {}}, "added_tokens": added}).encode()


@pytest.fixture(scope="module")
def readme_job(tmp_path_factory):
    """The README's minimal job spec with its checkpoints, manifests and output made local, as a
    function of changes to it -> the spec file's path."""
    root = tmp_path_factory.mktemp("readme")
    for name, ref in (("target", "HKUSTAudio/Llasa-8B"), ("draft", "HKUSTAudio/Llasa-1B")):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(LLASA.checkpoints[ref]))
        (root / name / "tokenizer.json").write_bytes(llasa_tokens())
    (root / "codec").mkdir()
    (root / "codec" / "config.json").write_text(json.dumps({"model_type": "xcodec2"}))
    (root / "m.jsonl").write_text('{"id": "a", "text": "Hello there."}\n{"id": "b", "text": "Good night."}\n')
    raw = yaml.safe_load(sizing_page.readme_yaml())
    assert raw["models"]["target"] == "HKUSTAudio/Llasa-8B" and raw["models"]["draft"] == "HKUSTAudio/Llasa-1B"
    raw["models"].update(target=str(root / "target"), draft=str(root / "draft"), codec=str(root / "codec"))
    raw.update(input={"manifests": [str(root / "m.jsonl")]}, output={"uri": str(root / "out")})

    def spec(decoding: dict | None = None, **resources) -> str:
        path = root / "job.json"
        changed = {**raw, "decoding": {**raw["decoding"], **(decoding or {})},
                   "resources": {**raw["resources"], **resources}}
        path.write_text(json.dumps(changed))  # JSON is YAML
        return str(path)
    return spec


def page_lines(fence: int) -> list[str]:
    """The dry-run lines the page's README example shows in its `fence`-th text block."""
    example = sizing_page.PAGE.read_text().split("<!-- sizing: example -->", 1)[1]
    block = example.split("```text\n")[fence].split("```", 1)[0]
    return [line for line in block.splitlines() if line.startswith("  ")]


def test_the_dry_run_of_the_readme_spec_prints_what_the_page_says(readme_job, capsys):
    assert main(["run", readme_job(), "--dry-run", "--gpu", "H100"]) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = page_lines(1)
    assert [line.split()[0] for line in shown] == ["memory", "fits", "speed"]
    assert all(line in printed for line in shown), (shown, printed)
    assert not [line for line in printed if "warning" in line]
    assert main(["run", readme_job(), "--dry-run"]) == 0  # no GPU named: the cards of 24, 40, 80 GB
    printed = capsys.readouterr().out.splitlines()
    assert page_lines(2)[0] in printed
    assert any(line.startswith("  hours      the job's ") for line in printed)


def test_a_dry_run_says_when_a_spec_will_not_fit(readme_job, capsys):
    assert main(["run", readme_job(), "--dry-run", "--gpu", "L4"]) == 0
    printed = capsys.readouterr().out
    assert "  fits       L4: no\n" in printed
    assert "warning    sizing: a worker needs about 37.7 GB (a projection) and does not fit the L4's 24 GB: " \
           "the models and allowances leave no room for a row" in printed
    assert main(["run", readme_job(batch_size=64), "--dry-run", "--gpu", "A100-40GB", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    (fit,) = report["sizing"]["fits"]
    assert not fit["fits"] and 0 < fit["largest_batch"] < 64
    assert any(f"set resources.batch_size to {fit['largest_batch']} or less" in w for w in report["warnings"])
    assert main(["run", readme_job(batch_size=400), "--dry-run"]) == 0  # fits none of 24, 40, 80 GB
    assert "more than 80 GB: lower resources.batch_size, or name a larger GPU with --gpu" in capsys.readouterr().out


def test_cpu_workers_are_not_sized(readme_job, capsys):
    assert main(["run", readme_job(gpus_per_worker=0, batch_size=2), "--dry-run", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sizing"] is None and not [w for w in report["warnings"] if "sizing" in w]



def test_workers_sharing_a_gpu_share_its_memory_and_bandwidth(readme_job, capsys):
    sized = {}
    for share, gpu in ((1, []), (1, ["--gpu", "H100"]), (0.5, ["--gpu", "H100"])):
        assert main(["run", readme_job(gpus_per_worker=share), "--dry-run", "--quiet", *gpu]) == 0
        sized[share, bool(gpu)] = json.loads(capsys.readouterr().out)["sizing"]
    half, whole = sized[0.5, True], sized[1, True]
    forty = next(f for f in sized[1, False]["fits"] if f["memory_gb"] == 40)
    assert half["fits"][0]["largest_batch"] == forty["largest_batch"] < whole["fits"][0]["largest_batch"]
    assert half["speed"]["round_s"] == pytest.approx(2 * whole["speed"]["round_s"])
    assert ", 0.5 of it a worker)" in "\n".join(sizing_lines(half))


def test_an_ar_job_keeps_no_draft_cache_and_reads_the_target_alone(readme_job, capsys):
    sized = {}
    for method in ("pcg", "ar"):
        assert main(["run", readme_job({"method": method, "gamma": 3}), "--dry-run", "--quiet", "--gpu", "H100"]) == 0
        sized[method] = json.loads(capsys.readouterr().out)["sizing"]
    ar, pcg = sized["ar"], sized["pcg"]
    assert ar["parts_bytes"]["draft"] == pcg["parts_bytes"]["draft"]  # loaded all the same
    assert ar["kv_per_row_bytes"] < pcg["kv_per_row_bytes"] and ar["speed"]["round_s"] < pcg["speed"]["round_s"]
    assert ar["speed"]["audio_hours_per_hour"] == pytest.approx(pcg["speed"]["ar_audio_hours_per_hour"], rel=0.01)
    speed_line = sizing_lines(ar)[2]
    assert "at most" in speed_line and "gamma" not in speed_line and "(ar:" not in speed_line


def test_gpu_names_and_flags(readme_job, capsys):
    assert gpu_named("a100-40gb").memory_gb == 40 and gpu_named("RTX4090").bandwidth == 1.008e12
    with pytest.raises(ValueError, match="not a GPU the sizing knows; choose one of H200, "):
        gpu_named("B300")
    assert main(["run", readme_job(), "--dry-run", "--gpu", "B300"]) == 2
    assert "not a GPU the sizing knows" in capsys.readouterr().err
    assert main(["run", readme_job(), "--gpu", "H100"]) == 2
    assert "--gpu sizes a dry run's workers: add --dry-run" in capsys.readouterr().err
    # the names torch gives these cards find their own data sheet, not a shorter name's
    for device, name in [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA L4", "L4"),
                         ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"), ("NVIDIA A10G", "A10G"),
                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                         ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA H200", "H200")]:
        assert gpu_of_device(device).name == name
    assert gpu_of_device("NVIDIA B200") is None and len({g.name for g in GPUS}) == len(GPUS)


@pytest.mark.parametrize("family, checkpoint", [(LLASA, "HKUSTAudio/Llasa-8B"), (LLASA, "HKUSTAudio/Llasa-1B"),
                                                (ORPHEUS, "canopylabs/orpheus-3b-0.1-ft")])
def test_the_weights_are_those_the_engine_allocates(family, checkpoint):
    """The engine's model built from the published config (on the meta device: no memory)."""
    import torch

    from engine.models.llama import LlamaLM, LlamaShape

    config = family.checkpoints[checkpoint]
    with torch.device("meta"):
        model = LlamaLM(LlamaShape.from_config(config), torch.arange(family.output_ids),
                        torch.ones(config["head_dim"] // 2)).to(torch.bfloat16)
    size = LMSize.from_config(config)
    assert size.parameters(family.output_ids) == model.num_parameters()
    assert size.step_parameters(family.output_ids) * 2 == model.step_weight_bytes()
    assert Worker(family, size, None, 1, 0).weights(size) == sum(p.numel() * 2 for p in model.parameters())


@pytest.mark.parametrize("gamma", [0, 3])
def test_the_decoders_caches_are_those_counted(gamma):
    """A decoder's preallocated caches and token ids (tiny models, the family's context and output ids)."""
    import torch

    from engine.decoding.speculative import SpeculativeDecoder
    from engine.families.base import OutputSpace, llama
    from engine.models.llama import LlamaLM, LlamaShape

    target_config, draft_config = llama(64, 128, 3, 4, 2, 16, 300, True), llama(32, 64, 2, 2, 1, 16, 300, True)

    def model(config):
        return LlamaLM(LlamaShape.from_config(config), torch.arange(LLASA.output_ids), torch.ones(8))

    target, draft = model(target_config), model(draft_config) if gamma else None
    decoder = SpeculativeDecoder(target, draft, gamma, 3, LLASA.context, OutputSpace(eos=LLASA.output_ids - 1))
    worker = Worker(LLASA, LMSize.from_config(target_config), LMSize.from_config(draft_config) if gamma else None,
                    3, gamma, "float32")
    st = decoder.state
    caches = [st.tcache] + ([st.dcache] if gamma else [])
    held = sum(t.numel() * t.element_size() for c in caches for t in [*c.k, *c.v])
    assert held == 3 * worker.kv_per_row()
    ids = st.tokens.numel() * 8 + (st.ar_draws.numel() * 8 if st.ar_draws is not None else 0)
    assert ids == 3 * 8 * worker.positions * (1 if gamma else 2)
    assert worker.positions == decoder.cache_len


def test_the_largest_batch_is_the_last_that_fits():
    for _, worker in sizing_page.setups():
        for gb in (24, 40, 80):
            most = worker.largest_batch(gb)
            if most:
                assert sizing_page.at(worker, most).total() <= gb * GB
            assert sizing_page.at(worker, most + 1).total() > gb * GB


def test_the_sizing_constants_are_the_engines():
    from engine.decoding.adaptive import CANDIDATES
    from engine.decoding.sizing import ATTENTION_SCORES
    from engine.models.attention import GROUPED_SCORES_BYTES
    from engine.runtime.sizing import AUTO_GAMMA_MAX

    assert ATTENTION_SCORES == GROUPED_SCORES_BYTES and AUTO_GAMMA_MAX == max(CANDIDATES)
