"""What `pcg-synth bench`, `eval` and `paper-table` share: model and quality-backend options,
comma-separated lists, the command line of a run, and the report writer."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from engine.cli_options import add_compile_arg, add_draft_weights_arg


def csv_of(kind):
    def parse(text: str):
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__}s") from exc
    return parse


def command_line(args=None) -> str:
    """How this run was started, for its result file (a wrapper may set `args.how`)."""
    if args is not None and getattr(args, "how", None):
        return args.how
    return "pcg-synth " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def out_stem(out: str) -> Path:
    path = Path(out)
    return path.with_suffix("") if path.suffix == ".json" else path


def write_report(doc: dict, stem: Path, text: str, plots=None) -> None:
    """STEM.json, STEM.md (`text`) and the PNGs `plots()` writes; prints the table and the paths."""
    write_json(doc, stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(text)
    written = [stem.with_suffix(".json"), stem.with_suffix(".md")] + (plots() if plots else [])
    print(text)
    print("written: " + ", ".join(map(str, written)))


def add_model_args(p: argparse.ArgumentParser, presets: bool) -> None:
    g = p.add_argument_group("models")
    if presets:
        g.add_argument("--preset", choices=["tiny", "llasa-1b-shape"],
                       help="tiny: the tiny kit (CPU); llasa-1b-shape: Llasa-1B dimensions, random "
                            "weights, 3-layer draft, built in memory (a GPU, or a CPU in bfloat16)")
    g.add_argument("--kit", help="a tiny kit directory" + (" (default for --preset tiny: ./kit when it is one, "
                                                         "else built into the cache)" if presets else ""))
    g.add_argument("--target", help="target checkpoint: a directory, Hub model id or URI")
    g.add_argument("--draft", help="draft checkpoint: a directory, Hub model id or URI (overrides a preset's draft)")
    g.add_argument("--streams", help="stream heads on the target (a directory, Hub model id or URI; `pcg-synth "
                                     "draft train --kind streams`): every speculative rule is also measured with "
                                     "them, side by side with the draft in the same run")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    add_compile_arg(g)
    add_draft_weights_arg(g)


def add_quality_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("quality backends (local files only)")
    g.add_argument("--asr", default="pocketsphinx",
                   help="pocketsphinx (bundled, weak), none, or a local HF CTC/Whisper checkpoint directory")
    g.add_argument("--speaker", default="resemblyzer",
                   help="resemblyzer (bundled weights), none, or a local HF x-vector (WavLM-SV) directory")
    g.add_argument("--dnsmos", action="store_true", help="also DNSMOS (pip install 'pcg-synth[dnsmos]')")
    g.add_argument("--metrics-device", default="cpu", help="where ASR/speaker models run")


def load_backends(args, prompts=None):
    from engine.metrics.asr import load_asr
    from engine.metrics.quality import Backends
    from engine.metrics.speaker import load_speaker

    dnsmos = None
    if args.dnsmos:
        from engine.metrics.dnsmos import DNSMOS

        dnsmos = DNSMOS()
    return Backends(asr=load_asr(args.asr, args.metrics_device),
                    speaker=load_speaker(args.speaker, args.metrics_device), dnsmos=dnsmos, prompts=prompts)
