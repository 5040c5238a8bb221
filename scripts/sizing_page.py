"""Writes the tables of docs/sizing.md from the sizing model (`engine/decoding/sizing.py`) and the
dry run's sizing (`engine/runtime/sizing.py`), so the page says what `pcg-synth run --dry-run`
says; `tests/cpu/test_sizing.py` fails when they differ.

    python scripts/sizing_page.py           # rewrite the page's generated blocks
    python scripts/sizing_page.py --check   # exit 1 where the page is not what the code computes

A generated block lies between `<!-- sizing: NAME -->` and `<!-- /sizing -->`; the prose around
it is the page's own.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import engine.decoding.sizing as model  # noqa: E402
from engine.config import JobSpec, decoding_default  # noqa: E402
from engine.decoding.sizing import GB, LMSize, Worker, gpu_named, speed  # noqa: E402
from engine.families import FAMILIES, Family  # noqa: E402
from engine.runtime.sizing import AUTO_GAMMA_MAX, MEMORY_CLASSES, job_sizing, rate, size, sizing_lines, span  # noqa: E402

PAGE = ROOT / "docs" / "sizing.md"
BLOCK = re.compile(r"(<!-- sizing: (\w+) -->\n)(.*?)(<!-- /sizing -->)", re.S)
GAMMA = 3  # the tables' draft length (the default)
BATCH = 32  # the batch of the round tables (the README's)
PAGE_GPUS = ("H100", "H200", "A100-80GB", "A100-40GB", "L40S", "A10G", "L4", "RTX 4090")
EXAMPLE_AUDIO_HOURS = 1000
EXAMPLE_GPU = "H100"
LABELS = {"canopylabs/orpheus-3b-0.1-ft": "Orpheus-3B"}


def published(checkpoint: str) -> tuple[Family, dict]:
    """The family and published config of a released checkpoint."""
    return next((f, f.checkpoints[checkpoint]) for f in FAMILIES.values() if checkpoint in f.checkpoints)


def layers_of(config: dict, layers: tuple[int, ...]) -> dict:
    """The config of a `draft init` draft made of `layers` of a checkpoint."""
    return {**config, "num_hidden_layers": len(layers)}


def setups() -> list[tuple[str, Worker]]:
    """The page's worker setups: each target alone (`ar`) and with a draft, at batch 1."""
    out = []
    for target, draft, label in (
            ("HKUSTAudio/Llasa-1B", (0, 1, 15), "its layers 0, 1, 15"),
            ("HKUSTAudio/Llasa-3B", "HKUSTAudio/Llasa-1B", "Llasa-1B"),
            ("HKUSTAudio/Llasa-8B", "HKUSTAudio/Llasa-1B", "Llasa-1B"),
            ("canopylabs/orpheus-3b-0.1-ft", (0, 1, 27), "its layers 0, 1, 27")):
        family, config = published(target)
        drafted = layers_of(config, draft) if isinstance(draft, tuple) else published(draft)[1]
        name = LABELS.get(target, target.split("/")[1])
        out.append((f"{name}, `ar`", Worker(family, LMSize.from_config(config), None, 1, 0)))
        out.append((f"{name} + {label}, gamma {GAMMA}",
                    Worker(family, LMSize.from_config(config), LMSize.from_config(drafted), 1, GAMMA)))
    return out


def at(worker: Worker, batch: int) -> Worker:
    return Worker(worker.family, worker.target, worker.draft, batch, worker.gamma, worker.dtype)


def models_block() -> str:
    rows = ["| model | parameters as loaded | weights | a decode step reads | keys and values per position "
            "| per row at the context |", "|---|---|---|---|---|---|"]
    for checkpoint in ("HKUSTAudio/Llasa-1B", "HKUSTAudio/Llasa-3B", "HKUSTAudio/Llasa-8B",
                       "canopylabs/orpheus-3b-0.1-ft"):
        family, config = published(checkpoint)
        lm, ids = LMSize.from_config(config), family.output_ids
        rows.append(f"| {checkpoint} | {lm.parameters(ids) / 1e9:.2f} B | {size(2 * lm.parameters(ids))} "
                    f"| {size(2 * lm.step_parameters(ids))} | {lm.kv_per_position(2) / 1e3:.0f} KB "
                    f"| {size(lm.kv_per_position(2) * family.context)} ({family.context:,} positions) |")
    return "\n".join(rows) + "\n"


def batches_block() -> str:
    head = " | ".join(f"{gb} GB" for gb in MEMORY_CLASSES)
    rows = [f"| worker | before any row | per row | {head} |", "|---|---|---|" + "---|" * len(MEMORY_CLASSES)]
    for label, worker in setups():
        fits = " | ".join(str(worker.largest_batch(gb)) for gb in MEMORY_CLASSES)
        rows.append(f"| {label} | {size(worker.base())} | {size(worker.per_row())} | {fits} |")
    return "\n".join(rows) + "\n"


def per_gpu_block(cell) -> str:
    rows = [f"| worker at batch {BATCH} | " + " | ".join(PAGE_GPUS) + " |", "|---|" + "---|" * len(PAGE_GPUS)]
    for label, worker in setups():
        worker = at(worker, BATCH)
        cells = []
        for name in PAGE_GPUS:
            gpu = gpu_named(name)
            cells.append(cell(worker, gpu) if worker.total() <= gpu.memory_gb * GB else "does not fit")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def rounds_block() -> str:
    return per_gpu_block(lambda worker, gpu: f"{speed(worker, gpu).round_s * 1e3:.1f} ms")


def throughput_block() -> str:
    return per_gpu_block(lambda worker, gpu: rate(speed(worker, gpu).audio_per_hour))


def readme_yaml() -> str:
    """The README's minimal job spec, as it stands there."""
    section = (ROOT / "README.md").read_text().split("## A minimal job spec", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def example_block() -> str:
    text = readme_yaml()
    spec = JobSpec.model_validate(yaml.safe_load(text))
    family, target = published(spec.models.target)
    draft = published(spec.models.draft)[1]
    named, _ = job_sizing(spec, family, target, draft, gpu_named(EXAMPLE_GPU), EXAMPLE_AUDIO_HOURS)
    classes, _ = job_sizing(spec, family, target, draft)
    hours = named["hours"]
    return ("```yaml\n" + text + "```\n\nIts dry run:\n\n"
            + "```text\n$ pcg-synth run job.yaml --dry-run --gpu H100\n...\n" + "\n".join(sizing_lines(named)[:3])
            + "\n```\n\nWithout `--gpu` the memory is checked against cards of 24, 40 and 80 GB:\n\n```text\n"
            + sizing_lines(classes)[1] + "\n```\n\n"
            + f"A job of {EXAMPLE_AUDIO_HOURS:,} hours of audio on these {spec.resources.workers} {EXAMPLE_GPU}s takes "
            f"at least {span(hours['projected_hours'])} (`ar`: {span(hours['ar_projected_hours'])}), projected.\n")


def assumptions_block() -> str:
    llasa, orpheus = (published(c)[0] for c in ("HKUSTAudio/Llasa-1B", "canopylabs/orpheus-3b-0.1-ft"))
    return (f"| part | as counted |\n|---|---|\n"
            f"| X-codec2 (Llasa) | {llasa.codec_parameters[0] / 1e6:.0f} M parameters in the models' dtype |\n"
            f"| SNAC 24 kHz (Orpheus) | {orpheus.codec_parameters[1] / 1e6:.1f} M parameters, all as float32 |\n"
            f"| a round's buffers, per row | {model.VOCAB_BUFFERS} float32 copies of `[gamma + 1, output ids]` |\n"
            f"| a prompt's prefill, per row | the activations of {model.PREFILL_TOKENS} prompt tokens |\n"
            f"| prefill attention, per worker | {model.ATTENTION_SCORES / 2**20:.0f} MiB of scores |\n"
            f"| the codec's decode activations, per worker | {size(model.CODEC_WORKSPACE)} |\n"
            f"| CUDA context, library workspaces, CUDA-graph pools, allocator slack, per worker "
            f"| {size(model.FIXED)} |\n"
            f"| `gamma: auto` | sized for gamma {AUTO_GAMMA_MAX}, the longest it may choose; projected at "
            f"gamma {decoding_default('gamma')}, the default |\n")


def gpus_block() -> str:
    cards = [gpu_named(name) for name in PAGE_GPUS]
    return ("Memory and bandwidth from the vendor data sheets (H100: the SXM card): "
            + "; ".join(f"{g.name} {g.memory_gb:g} GB, {g.bandwidth / 1e12:g} TB/s" for g in cards) + ".\n")


BLOCKS = {"assumptions": assumptions_block, "gpus": gpus_block, "models": models_block, "batches": batches_block,
          "rounds": rounds_block, "throughput": throughput_block, "example": example_block}


def render(page: str) -> str:
    """`page` with every generated block made again."""
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group(2)]() + m.group(4), page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/sizing.md's tables from the sizing model.")
    parser.add_argument("--check", action="store_true", help="exit 1 where the page differs from the code")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    made = render(page)
    if args.check:
        if made != page:
            print(f"{PAGE.relative_to(ROOT)} is not what the code computes: run python scripts/sizing_page.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
