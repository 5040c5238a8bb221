"""`pcg-synth draft init | train | eval`; `register(sub)` adds them to the main CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.cli_options import add_draft_weights_arg, add_settings_arguments, settings_from_args
from engine.config import DecodingSettings
from engine.draft.evaluate import DEFAULT_METHODS


def cmd_init(args) -> int:
    from engine.draft.init import init_draft

    out = init_draft(args.target, args.out, layers=args.layers, source=args.source, force=args.force,
                     max_shard_bytes=int(args.max_shard_gb * 1024**3), progress=not args.quiet)
    info = json.loads((out / "pcg_draft.json").read_text())
    print(f"draft written to {out}: layers {info['layers']} of {info['source']} "
          f"({info['source_layers']} layers)")
    return 0


def settings_from(args):
    from engine.config import StorageOptions
    from engine.draft.settings import TrainSettings

    fields = {k: getattr(args, k) for k in (
        "data", "draft", "out", "target", "loss", "temperature", "steps", "batch_size",
        "micro_batch_size", "max_length", "lr", "warmup_steps", "weight_decay", "grad_clip",
        "heldout_fraction", "heldout_max", "eval_every", "checkpoint_every", "keep_checkpoints",
        "seed", "device", "dtype", "cache_target")}
    fields["trainable"] = [p for p in args.trainable.split(",") if p.strip()]
    storage = {k: getattr(args, k) for k in ("endpoint_url", "region", "profile") if getattr(args, k)}
    fields["storage"] = StorageOptions(**storage)
    return TrainSettings(**{k: v for k, v in fields.items() if v is not None})


def streams_settings_from(args):
    from engine.config import StorageOptions
    from engine.draft.streams import StreamsSettings

    if args.draft:
        raise ValueError("--kind streams trains new heads on the target: drop --draft")
    if not args.target:
        raise ValueError("--kind streams needs --target DIR (the model the heads run on)")
    fields = {k: getattr(args, k) for k in (
        "data", "target", "out", "heads", "intermediate_size", "temperature", "steps", "anchors", "lr",
        "warmup_steps", "max_length", "heldout_fraction", "heldout_max", "seed", "device", "dtype")}
    storage = {k: getattr(args, k) for k in ("endpoint_url", "region", "profile") if getattr(args, k)}
    fields["storage"] = StorageOptions(**storage)
    return StreamsSettings(**{k: v for k, v in fields.items() if v is not None})


def cmd_train(args) -> int:
    if args.kind == "streams":
        streams = streams_settings_from(args)  # validated before any loading
        if args.workers:
            from engine.draft.streams_ray import train_streams_ray

            record = train_streams_ray(streams, args.workers, use_gpu=args.use_gpu, address=args.address,
                                       storage_path=args.storage_path)
        else:
            from engine.draft.streams import train_streams

            record = train_streams(streams, progress=not args.quiet)
        per_head = record.get("acceptance_after")
        print(f"stream heads written to {streams.out}: {record['parameters']:,} parameters "
              f"({record['parameters'] / record['target_parameters']:.1%} of the target's); held-out acceptance "
              f"per head {record.get('acceptance_before')} -> {per_head}")
        return 0
    if not args.draft:
        raise ValueError("draft train needs --draft DIR (the initial draft, e.g. from `draft init`), "
                         "or --kind streams")
    settings = settings_from(args)  # validated before any loading
    if args.workers:
        from engine.draft.distributed import train_draft_ray

        record = train_draft_ray(settings, args.workers, use_gpu=args.use_gpu, address=args.address,
                                 storage_path=args.storage_path, max_failures=args.max_failures)
    else:
        from engine.draft.run import train_draft

        record = train_draft(settings, progress=not args.quiet)
    shown = {k: round(v, 5) if isinstance(v, float) else v for k, v in record.items()}
    print(f"trained draft written to {settings.out}: {json.dumps(shown)}")
    return 0


def cmd_eval(args) -> int:
    from engine.draft.evaluate import ModelLoading, evaluate_drafts, format_eval, read_texts

    methods = [m for m in args.methods.split(",") if m.strip()]
    if args.out and Path(args.out).suffix != ".json":
        raise ValueError(f"--out {args.out}: write a .json file")
    base = settings_from_args(args, DecodingSettings)  # the flags given; the rest: its defaults
    loading = ModelLoading(device=args.device, dtype=args.dtype, draft_weights=args.draft_weights)
    result = evaluate_drafts(args.target, args.draft, read_texts(args.texts_file), methods, base, loading,
                             batch_size=args.batch_size, progress=not args.quiet)
    print(format_eval(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"target": args.target, **result}, indent=1))
        print(f"written to {args.out}")
    return 0


def add_init(dsub) -> None:
    p = dsub.add_parser("init", help="a draft from chosen target layers, or any same-vocabulary model",
                        description="Write a draft checkpoint (Hugging Face Llama format): the chosen "
                                    "decoder layers of --source (default: the target) with its "
                                    "embeddings, final norm and head.")
    p.add_argument("--target", required=True, help="target checkpoint directory")
    p.add_argument("--out", required=True, help="directory for the draft")
    p.add_argument("--layers", help="source layers to keep, in order, e.g. 0,1,15 (default with "
                                    "--source: all of them)")
    p.add_argument("--source", help="take layers from this model instead (same vocabulary as the "
                                    "target, e.g. Llasa-1B for Llasa-8B)")
    p.add_argument("--max-shard-gb", type=float, default=2.0, help="largest safetensors shard written")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_init)


def add_train(dsub) -> None:
    from engine.draft.settings import TrainSettings

    p = dsub.add_parser("train", help="distil (kd) or fine-tune (ce) a draft, or distil stream heads",
                        description="Train a draft on speech-code sequences: knowledge distillation "
                                    "from the target on datasets this engine produced, cross-entropy "
                                    "on other code datasets. Rerunning the same command resumes. "
                                    "--kind streams distils stream heads on the target instead (no "
                                    "draft model; the heads only are written).")
    p.add_argument("--kind", choices=["model", "streams"], default="model",
                   help="model: a draft model (default); streams: stream heads on the target")
    p.add_argument("--data", required=True, help=".parquet/.jsonl file, directory or s3:// prefix, or a "
                   "`generate --out FILE.json` file")
    p.add_argument("--draft", help="initial draft (e.g. from `draft init`; --kind model)")
    p.add_argument("--out", required=True, help="output directory (trained draft, checkpoints, log)")
    p.add_argument("--target", help="target checkpoint (the kd teacher; held-out acceptance)")
    p.add_argument("--temperature", type=float, help="kd temperature (default: the data's, else 0.8)")
    p.add_argument("--trainable", default="layers,norm",
                   help="trained parts among layers,norm,embeddings,head (default layers,norm)")
    add_settings_arguments(p, TrainSettings, include=[
        "loss", "steps", "batch_size", "micro_batch_size", "max_length", "lr", "warmup_steps", "weight_decay",
        "grad_clip", "heldout_fraction", "heldout_max", "eval_every", "checkpoint_every",
        "keep_checkpoints", "seed"])
    heads = p.add_argument_group("stream heads (--kind streams)")
    heads.add_argument("--heads", type=int, help="heads: the largest gamma they draft (default 4)")
    heads.add_argument("--intermediate-size", type=int,
                       help="each head's MLP width (default: the target's hidden size)")
    heads.add_argument("--anchors", type=int, help="anchor positions per step (default 128)")
    p.add_argument("--cache-target", action="store_true", default=None,
                   help="keep the target's logits of every sequence in memory (small datasets)")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N (single-process runs)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"],
                   help="training precision (auto: bfloat16 autocast where the device has it)")
    ray_group = p.add_argument_group("Ray Train (several GPUs or nodes)")
    ray_group.add_argument("--workers", type=int, default=0, help="0: this process; N: N Ray Train workers")
    ray_group.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=None,
                           help="one GPU per worker (default: when the cluster has enough)")
    ray_group.add_argument("--address", help="Ray cluster (default: $RAY_ADDRESS, else a local one)")
    ray_group.add_argument("--storage-path", help="where Ray keeps checkpoints (shared or s3://; default OUT/ray)")
    ray_group.add_argument("--max-failures", type=int, default=0, help="worker-group restarts")
    s3 = p.add_argument_group("S3")
    s3.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// data (unset: AWS S3)")
    s3.add_argument("--region", help="AWS region of the bucket")
    s3.add_argument("--profile", help="AWS profile name from ~/.aws")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def add_eval(dsub) -> None:
    p = dsub.add_parser("eval", help="mean accepted length and per-position acceptance of drafts",
                        description="Decode held-out texts with each --draft against --target and "
                                    "report acceptance per rule (before/after training: pass both).")
    p.add_argument("--target", required=True, help="target checkpoint (directory, Hub id or URI)")
    p.add_argument("--draft", required=True, action="append", help="a draft directory (repeatable)")
    p.add_argument("--texts-file", help="one text per line (default: built-in held-out texts)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated acceptance rules (default: {','.join(DEFAULT_METHODS)})")
    add_settings_arguments(p, DecodingSettings, include=["gamma", "theta", "temperature", "max_new_tokens", "seed"],
                           defaults={"max_new_tokens": 128})
    p.add_argument("--batch-size", type=int, default=8, help="held-out texts decoded together")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    add_draft_weights_arg(p)
    p.add_argument("--out", help="also write the figures to FILE.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def cmd_import_llasa_plus(args) -> int:
    from engine.models.loading import load_model
    from engine.models.streams import import_llasa_plus, read_streams_info

    target = load_model(args.target, device="cpu", dtype="float32", prepack=False)
    out = import_llasa_plus(args.checkpoint, target.model, args.target, args.out)
    info = read_streams_info(out)
    print(f"LLaSA+ modules written to {out} as stream heads: {info['shape']['heads']} modules, "
          f"{info['parameters']:,} parameters; draft with them: --draft {out} (gamma at most "
          f"{info['shape']['heads']})")
    return 0


def add_import_llasa_plus(dsub) -> None:
    p = dsub.add_parser("import-llasa-plus", help="LLaSA+'s multi-token modules as stream heads",
                        description="Read the multi-token modules (mtp_<k>_*) of a LLaSA+ checkpoint "
                                    "(ASLP-lab/LLaSA_Plus) and write them as a stream-heads directory "
                                    "for --target, the Llasa backbone they were trained on.")
    p.add_argument("--checkpoint", required=True, help="LLaSA+'s model.safetensors, or a directory holding it")
    p.add_argument("--target", required=True, help="the backbone's own checkpoint (e.g. Llasa-1B)")
    p.add_argument("--out", required=True, help="directory for the heads")
    p.set_defaults(func=cmd_import_llasa_plus)


def register(sub) -> None:
    """Add `draft init | train | eval` to the top-level subparsers `sub`."""
    p = sub.add_parser("draft", help="draft models: build, distil, evaluate",
                       description="Build a draft for any target, train it on speech codes, and "
                                   "measure its acceptance.")
    dsub = p.add_subparsers(dest="draft_cmd", required=True)
    add_init(dsub)
    add_train(dsub)
    add_eval(dsub)
    add_import_llasa_plus(dsub)
