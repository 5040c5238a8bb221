"""`pcg-synth groups build | stats | sweep`; `register(sub)` adds the commands to the main CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from engine.groups.options import BACKENDS, SOURCES, GroupsBuild, check_cap, check_theta, parse_ranges

if TYPE_CHECKING:
    import torch


class Rows(NamedTuple):
    """Code-token rows to group, and the layout they come with."""

    embeddings: torch.Tensor  # [V, D]
    described: str  # what they are, for people
    family: str | None  # the checkpoint's family; None for bare rows
    ranges: list[tuple[int, int]] | None  # code ranges; None: one range


def code_ranges_arg(args) -> list[tuple[int, int]] | None:
    """`--ranges`, parsed (only with `--embeddings`: a checkpoint's come from its tokenizer)."""
    if not getattr(args, "ranges", None):
        return None
    if not args.embeddings:
        raise ValueError("--ranges goes with --embeddings; a --target checkpoint's code ranges are read "
                         "from its tokenizer")
    return parse_ranges(args.ranges)


def read_embeddings(args) -> Rows:
    """The rows from `--target DIR` (with its family and code ranges) or `--embeddings FILE.npy`
    (with `--ranges`, else one range)."""
    import numpy as np
    import torch

    from engine.groups.source import load_speech_rows

    ranges = code_ranges_arg(args)
    if args.embeddings:
        path = Path(args.embeddings)
        if not path.is_file():
            raise ValueError(f"--embeddings {path} does not exist")
        try:
            return Rows(torch.from_numpy(np.load(path, allow_pickle=False)), str(path), None, ranges)
        except (ValueError, OSError) as exc:
            raise ValueError(f"--embeddings {path}: not a .npy matrix ({exc})") from None
    if not args.target:
        raise ValueError("give --target DIR (a checkpoint) or --embeddings FILE.npy")
    rows, layout = load_speech_rows(args.target, args.source)
    return Rows(rows, f"{args.target} ({layout.family}, {args.source})", layout.family, layout.ranges)


def add_source_args(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("embeddings")
    src.add_argument("--target", help="target checkpoint directory (reads only the speech rows)")
    src.add_argument("--embeddings", help="or a [tokens, dim] matrix saved with numpy.save")
    src.add_argument("--source", default="input_embeddings", choices=SOURCES,
                     help="which table of the checkpoint (tied models: the same rows)")
    src.add_argument("--ranges", help="code ranges of the --embeddings rows, sizes in order (e.g. 7x4096 or "
                                      "4096,8192): a group never mixes ranges (default: one range; a "
                                      "--target checkpoint's ranges come from its tokenizer)")
    src.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="auto: faiss where installed (GPU build only with a GPU), else torch")
    src.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (in-process search)")
    src.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_build(args) -> int:
    from engine.groups.cache import LocalDirStore, build_with_metadata, cache_key, default_cache_dir
    from engine.groups.source import embeddings_sha256
    from engine.groups.stats import format_stats, group_stats
    from engine.groups.store import describe_ranges, to_bytes
    from engine.io.storage import write_atomic

    theta, cap = check_theta(args.theta), check_cap(args.max_group_size)  # before any loading
    if args.workers < 0:
        raise ValueError(f"--workers must be >= 0; got {args.workers}")
    rows = read_embeddings(args)
    emb_hash = embeddings_sha256(rows.embeddings)
    build = GroupsBuild(theta, cap, args.dedup, rows.ranges, rows.family, args.source, args.backend,
                        args.workers, args.device, progress=not args.quiet)
    groups = build_with_metadata(rows.embeddings, build, embeddings_hash=emb_hash)
    data = to_bytes(groups)
    if args.out:
        out = Path(args.out)
        write_atomic(out, data)
    else:
        store = LocalDirStore(args.cache_dir or default_cache_dir())
        key = cache_key(emb_hash, theta, cap, args.dedup, groups.code_ranges, rows.family)
        store.put(key, data)
        out = store.path(key)
    meta = groups.meta
    print(f"groups of {rows.described}: theta {theta:g}, cap {cap}, {describe_ranges(groups.code_ranges)}, "
          f"backend {meta['backend']}, {meta['build_seconds']:.1f} s")
    print(format_stats(group_stats(groups)))
    print(f"written to {out} ({len(data)} bytes)")
    return 0


def cmd_stats(args) -> int:
    from engine.groups.stats import format_stats
    from engine.groups.store import describe_ranges, load_groups

    path = Path(args.path)
    groups = load_groups(path)
    meta = groups.meta
    if args.json:
        print(json.dumps({**meta, "file_bytes": path.stat().st_size}, indent=1))
        return 0
    title = (f"{path}: format v{meta['format_version']}, theta {meta['theta']:g}, cap "
             f"{meta['max_group_size']}, dedup {meta['dedup']}, family {meta['family'] or 'unknown'}, "
             f"{describe_ranges(meta['ranges'])}, source {meta['source']}, "
             f"embeddings {tuple(meta['embeddings_shape'])} sha256 {meta['embeddings_sha256'][:16]}..., "
             f"{path.stat().st_size} bytes")
    print(format_stats(meta["stats"], title))
    return 0


def cmd_sweep(args) -> int:
    from engine.groups.sweep import format_sweep, parse_thetas, sweep

    thetas = parse_thetas(args.thetas)
    source = read_embeddings(args)
    rows = sweep(source.embeddings, thetas, args.backend, args.device, progress=not args.quiet,
                 ranges=source.ranges)
    print(json.dumps(rows, indent=1) if args.json else f"groups of {source.described}\n{format_sweep(rows)}")
    return 0


def register(sub) -> None:
    """Add `groups build | stats | sweep` to the top-level subparsers `sub`."""
    p = sub.add_parser("groups", help="Acoustic Similarity Groups: build, inspect, choose theta",
                       description="Build, inspect and size the target's Acoustic Similarity Groups.")
    gsub = p.add_subparsers(dest="groups_cmd", required=True)
    b = gsub.add_parser("build", help="build groups into a file (or the cache)")
    add_source_args(b)
    b.add_argument("--theta", type=float, required=True, help="cosine threshold in (0, 1]")
    b.add_argument("--max-group-size", type=int, help="cap on members per group (cut groups are counted)")
    b.add_argument("--dedup", action="store_true", help="store identical groups once")
    b.add_argument("--workers", type=int, default=0,
                   help="0: build in this process; N: N Ray workers (one per GPU where there are GPUs)")
    b.add_argument("--out", help="output file (default: the groups cache)")
    b.add_argument("--cache-dir", help="cache directory (default $PCG_SYNTH_CACHE/groups or "
                                       "~/.cache/pcg-synth/groups)")
    b.set_defaults(func=cmd_build)
    s = gsub.add_parser("stats", help="verify a groups file and print its statistics")
    s.add_argument("path", help="a groups file (from `groups build`)")
    s.add_argument("--json", action="store_true", help="print the metadata as JSON")
    s.set_defaults(func=cmd_stats)
    w = gsub.add_parser("sweep", help="mean group size and coverage per theta")
    add_source_args(w)
    w.add_argument("--thetas", required=True, help="comma-separated, e.g. 0.35,0.40,0.45")
    w.add_argument("--json", action="store_true", help="print the table as JSON")
    w.set_defaults(func=cmd_sweep)
