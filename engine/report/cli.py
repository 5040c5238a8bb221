"""The `pcg-synth report` command."""

from __future__ import annotations

import json


def cmd_report(args) -> int:
    from engine.config import StorageOptions
    from engine.console import counted
    from engine.report import write_report

    storage = StorageOptions(**{k: getattr(args, k) for k in ("endpoint_url", "region", "profile")
                                if getattr(args, k)})
    done = write_report(args.output, dest=args.out, sample=args.sample, seed=args.seed, storage_options=storage,
                        progress=not args.quiet)
    if args.quiet:
        print(json.dumps(done))
        return 0
    print(f"{done['dest']}: {counted(done['rows'], 'row')} of {counted(done['shards'], 'shard')} "
          f"({done['ok']} with audio, {done['rejected']} rejected, {counted(done['errors'], 'error record')}, "
          f"{done['cut']} cut), {counted(done['sampled'], 'player')}, {done['bytes'] / 1e6:.1f} MB; "
          "open it in a browser (it needs no network)")
    return 0


def register(sub) -> None:
    """Add the `report` command to `pcg-synth`'s subparsers."""
    p = sub.add_parser("report", help="write an HTML report of a job's output: summary, histograms, rows, players",
                       description="Read a job's output (local or s3://; hf-parquet, nemo or lhotse-shar, or a "
                                   "`convert` destination) and write one self-contained HTML page: the summary, "
                                   "histograms of duration, speaking rate, acceptance and the quality gate's "
                                   "scores, audio players for a sample of rows (rejects and cut rows among "
                                   "them), a sortable table of every row and the rejects and error records. "
                                   "The page needs no network.")
    p.add_argument("output", help="the job's output directory or s3:// prefix (output.uri)")
    p.add_argument("-o", "--out", help="where to write the page (default: OUTPUT/report.html for a local "
                                       "output, ./NAME-report.html for one on object storage)")
    p.add_argument("--sample", type=int, default=24, help="rows to embed audio players for (default: 24)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample's draw (default: 0)")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://minio:9000 (unset: AWS S3)")
    p.add_argument("--region", help="AWS region of the bucket(s)")
    p.add_argument("--profile", help="AWS profile name from ~/.aws")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print a JSON line")
    p.set_defaults(func=cmd_report)
