"""`pcg-synth bench`, `pcg-synth eval` and `pcg-synth paper-table`.

`engine.cli` calls `register(sub)`; each command returns an exit status and raises ValueError
for user mistakes (printed as one line by the main).
"""

from __future__ import annotations

import json
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
from engine.cli_options import add_settings_arguments, settings_from_args
from engine.config import METHODS, DecodingSettings, decoding_default

# ---- bench ------------------------------------------------------------------------------------


def gamma_value(text: str) -> int | str:
    """An integer draft length, or `auto`."""
    return text.strip() if text.strip() == "auto" else int(text)


def cmd_bench(args) -> int:
    from engine.bench.plots import bench_plots, quality_vs_speedup
    from engine.bench.presets import LoadOptions, heads_synthesizer, load_synthesizer
    from engine.bench.report import markdown
    from engine.bench.runner import BenchConfig, run_bench

    base = settings_from_args(args, DecodingSettings)  # the flags given; the rest: its defaults
    cfg = BenchConfig(methods=args.methods, batch_sizes=args.batch_sizes, gammas=args.gammas,
                      thetas=args.thetas, reps=args.reps, max_new_tokens=base.max_new_tokens,
                      items_per_slot=args.items_per_slot, temperature=base.temperature, beta=base.beta,
                      topk=base.topk, cost_model=not args.no_cost_model, cost_reps=args.cost_reps,
                      context=args.context)
    cfg.check()  # before loading any model
    options = LoadOptions(args.device, args.dtype, args.compile, args.draft_weights)
    synth, models = load_synthesizer(args.preset, args.target, args.draft, args.kit, options, args.save_preset)
    heads = heads_synthesizer(synth, args.streams, models) if args.streams else None
    doc = run_bench(synth, cfg, models, command_line(args), progress=not args.quiet, heads=heads)
    stem = out_stem(args.out or default_out(args))

    def plots() -> list[Path]:
        written = bench_plots(doc, stem)
        if args.quality:
            table = json.loads(Path(args.quality).read_text())
            written.append(quality_vs_speedup(table, stem.with_name(stem.name + "_quality_vs_speedup.png")))
        return written

    write_report(doc, stem, markdown(doc), None if args.no_plots else plots)
    return 0


def default_out(args) -> str:
    """`out/bench/<preset or model name>.json` (out/ is where every run's output goes, ignored by git)."""
    return build_default_out_args(args.preset, args.kit or args.target)


def build_default_out_args(preset: str | None, model: str | None = None) -> str:
    name = preset or (Path(model.rstrip("/")).name if model else "") or "bench"
    return str(Path("out") / "bench" / f"{name}.json")


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="speed of the acceptance rules: tokens/s, speedup, acceptance, cost model",
                       description="Decode the same items with every method (interleaved, warm-up "
                                   "excluded, repeated) over batch sizes, gamma and theta, with the draft "
                                   "model and, given --streams, with stream heads too; write JSON, "
                                   "a markdown table and PNG plots.")
    add_model_args(p, presets=True)
    p.add_argument("--save-preset", help="llasa-1b-shape: also write its target/ and draft/ checkpoints here")
    g = p.add_argument_group("grid")
    g.add_argument("--methods", type=csv_of(str), default=METHODS,
                   help=f"acceptance rules, comma-separated (default: {','.join(METHODS)})")
    batch_sizes = (1, 8, 32)
    g.add_argument("--batch-sizes", type=csv_of(int), default=batch_sizes,
                   help=f"batch sizes, comma-separated (default: {','.join(map(str, batch_sizes))})")
    g.add_argument("--gammas", type=csv_of(gamma_value), default=(decoding_default("gamma"),),
                   help=f"draft lengths and/or auto, comma-separated (default: {decoding_default('gamma')})")
    g.add_argument("--thetas", type=csv_of(float), default=(decoding_default("theta"),),
                   help=f"PCG thresholds, comma-separated (default: {decoding_default('theta')})")
    g.add_argument("--reps", type=int, default=3, help="repetitions (medians and min/max over them)")
    add_settings_arguments(g, DecodingSettings, include=["max_new_tokens"], defaults={"max_new_tokens": 64})
    g.add_argument("--items-per-slot", type=int, default=2, help="items per run = this x batch size")
    add_settings_arguments(g, DecodingSettings, include=["temperature", "beta", "topk"])
    c = p.add_argument_group("cost model")
    c.add_argument("--no-cost-model", action="store_true", help="skip the step timings")
    c.add_argument("--cost-reps", type=int, default=10, help="timed calls of each step (medians)")
    c.add_argument("--context", type=int, help="KV length for step timings (default: mean prompt + half the budget)")
    o = p.add_argument_group("output")
    o.add_argument("--out", help="PATH.json; PATH.md and PATH_*.png are written beside it "
                                 "(default: out/bench/<preset or model name>.json)")
    o.add_argument("--quality", help="a paper-table JSON: adds the quality-vs-speedup plot")
    o.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)


# ---- eval -------------------------------------------------------------------------------------


def cmd_eval(args) -> int:
    from engine.io.storage import Storage
    from engine.metrics.quality import (
        evaluate_table,
        summarize,
        summary_lines,
        write_results,
    )
    from engine.metrics.references import PromptClips, read_dataset, sibling

    storage = Storage()
    table = read_dataset(args.dataset, storage)  # a bad path fails before models load
    job = job_record(args.dataset, storage)
    manifests, codec_ref = args.prompts, args.codec
    if job is not None and not manifests and job.get("manifests"):
        manifests = job["manifests"]
        print(f"voice prompts: the job's manifests ({', '.join(manifests)}, from _job.json)")
    prompts = PromptClips(manifests, None, storage) if manifests else None
    if codec_ref is None and job is not None and prompts is not None and prompts.has_codes:
        codec_ref = job.get("spec", {}).get("models", {}).get("codec")
        if codec_ref:
            print(f"codec for code-only voice prompts: {codec_ref} (from the job's _job.json)")
    if codec_ref and prompts is not None:
        from engine.codec.load import load_codec

        prompts.codec = load_codec(codec_ref, device=args.metrics_device, dtype="float32")
    backends = load_backends(args, prompts)
    if backends.speaker is not None and prompts is None:
        backends.notes.append("no speaker similarity: give the generation manifest with --prompts")
    rows = evaluate_table(table, backends, batch=args.batch, progress=not args.quiet)
    if backends.speaker is not None and prompts is not None:
        backends.notes.extend(prompts.notes())
    summary = {"dataset": args.dataset, **summarize(rows, backends)}
    out = args.out or sibling(args.dataset, ".eval.parquet")
    summary_uri = write_results(rows, summary, out, storage)
    print(summary_lines(summary))
    print(f"per-row metrics: {out}\nsummary: {summary_uri}")
    return 0


def job_record(dataset: str, storage) -> dict | None:
    """The `_job.json` of a job's output directory (its spec and shard plan), else None."""
    from engine.io.storage import join

    if dataset.rstrip("/").endswith(".parquet"):
        return None
    uri = join(dataset, "_job.json")
    return json.loads(storage.read_bytes(uri)) if storage.exists(uri) else None


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="quality of a produced audio dataset: WER/CER, speaker similarity, DNSMOS",
                       description="Transcribe every clip (offline ASR), score WER/CER against its input "
                                   "text, speaker similarity to its voice prompt and optionally DNSMOS; "
                                   "write per-row metrics (Parquet) and a summary (JSON).")
    p.add_argument("dataset", help="a .parquet dataset file or a job's output directory (local or s3://)")
    p.add_argument("--prompts", action="append", help="the manifest(s) the dataset was made from: voice-prompt "
                                                     "clips for speaker similarity (repeatable; default for a "
                                                     "job's output: the job's manifests, from its _job.json)")
    p.add_argument("--codec", help="the codec's checkpoint (directory or Hub id): decode prompts given only as "
                                   "codes (default for a job's output: the job's models.codec)")
    add_quality_args(p)
    p.add_argument("--batch", type=int, default=16, help="clips per ASR call")
    p.add_argument("--out", help="per-row metrics .parquet (default: DATASET.eval.parquet beside it)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def register(sub) -> None:
    """Add `bench`, `eval` and `paper-table` to the `pcg-synth` subparsers."""
    from engine.bench.paper_cli import add_paper_table

    add_bench(sub)
    add_eval(sub)
    add_paper_table(sub)
