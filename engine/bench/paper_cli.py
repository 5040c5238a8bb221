"""`pcg-synth paper-table`: the paper's protocol as one command."""

from __future__ import annotations

from pathlib import Path

from engine.bench.cli_common import (
    add_model_args,
    add_quality_args,
    command_line,
    csv_of,
    load_backends,
    out_stem,
    write_report,
)
from engine.bench.paper import PaperConfig
from engine.cli_options import add_settings_arguments, settings_from_args
from engine.config import DecodingSettings


def cmd_paper_table(args) -> int:
    from engine.bench.paper import PaperRun, render, run_protocol
    from engine.bench.presets import LoadOptions, heads_synthesizer, load_synthesizer, tiny_kit
    from engine.codec.load import load_codec
    from engine.metrics.references import PromptClips

    base = settings_from_args(args, DecodingSettings)  # the flags given; the rest: its defaults
    cfg = PaperConfig(methods=args.methods, gamma=base.gamma, theta=base.theta, beta=base.beta,
                      temperature=base.temperature, seeds=args.seeds, batch_size=args.batch_size,
                      max_new_tokens=base.max_new_tokens, limit=args.limit)
    for method in cfg.methods:
        cfg.settings(method, 0)  # invalid settings fail before any model loads
    if (args.manifest is None) == (not args.demo):
        raise ValueError("give --manifest URI (rows: id, text, prompt_text, prompt_audio) or --demo")
    out = Path(args.out)
    manifest = args.manifest
    if args.demo:
        from engine.bench.demo import write_demo_manifest

        manifest = str(write_demo_manifest(out / "demo-manifest"))
    preset = "tiny" if (args.kit or (args.target is None)) else None
    options = LoadOptions(args.device, args.dtype, args.compile, args.draft_weights)
    synth, models = load_synthesizer(preset, args.target, args.draft, args.kit, options)
    codec_dir = args.codec or (str(tiny_kit(args.kit) / "codec") if preset == "tiny" else None)
    if codec_dir is None:
        raise ValueError("give --codec DIR (the model family's codec checkpoint) to turn codes into audio")
    codec = load_codec(codec_dir, device=str(synth.device), encoder_device="cpu")
    synth.family.check_codec(codec, f"--codec {codec_dir}")
    models["codec"] = codec_dir
    heads = heads_synthesizer(synth, args.streams, models) if args.streams else None
    backends = load_backends(args, PromptClips([manifest]))
    run = PaperRun(codec, cfg, out, backends, progress=not args.quiet)
    doc = run_protocol(synth, manifest, run, models, command_line(args), heads=heads)
    stem = out_stem(args.table) if args.table else out / "paper_table"

    def plots() -> list[Path]:
        from engine.bench.plots import quality_vs_speedup

        return [quality_vs_speedup(doc, stem.with_name(stem.name + "_quality_vs_speedup.png"))]

    write_report(doc, stem, render(doc), None if args.no_plots else plots)
    return 0


def add_paper_table(sub) -> None:
    p = sub.add_parser("paper-table", help="the paper's protocol: speedup, WER, CER, similarity over seeds",
                       description="Cross-sentence voice cloning over a manifest with every method and "
                                   "several seeds (the paper's settings by default); speed, audio, "
                                   "quality; a table as the paper's Table 1 (mean +- std over seeds).")
    add_model_args(p, presets=False)
    p.add_argument("--codec", help="the model family's codec checkpoint directory (default with --kit: the kit's)")
    src = p.add_argument_group("input")
    src.add_argument("--manifest", help="rows: id, text, prompt_text, prompt_audio (a clip, relative "
                                        "to the manifest); e.g. LibriTTS test-clean cross-sentence pairs")
    src.add_argument("--demo", action="store_true", help="a generated 6-row manifest with synthetic voice "
                                                         "prompts (for the tiny kit; numbers mean nothing)")
    src.add_argument("--limit", type=int, help="first N rows only")
    d = p.add_argument_group("protocol")
    d.add_argument("--methods", type=csv_of(str), default=PaperConfig.methods,
                   help=f"acceptance rules, comma-separated (default: {','.join(PaperConfig.methods)})")
    add_settings_arguments(d, DecodingSettings, include=["gamma", "theta", "beta", "temperature"])
    d.add_argument("--seeds", type=csv_of(int), default=PaperConfig.seeds,
                   help=f"sampling seeds, comma-separated (default: {','.join(map(str, PaperConfig.seeds))})")
    d.add_argument("--batch-size", type=int, default=PaperConfig.batch_size,
                   help=f"rows decoded together (default: {PaperConfig.batch_size})")
    add_settings_arguments(d, DecodingSettings, include=["max_new_tokens"])
    add_quality_args(p)
    p.add_argument("--out", required=True, help="output directory: datasets/ (audio per method and seed), "
                                                "paper_table.{json,md} and a plot")
    p.add_argument("--table", help="write the table files as TABLE.json/.md/_quality_vs_speedup.png instead")
    p.add_argument("--no-plots", action="store_true", help="write no plot")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_paper_table)
