"""Group-size statistics: what `pcg-synth groups stats` prints and the file's metadata records."""

from __future__ import annotations

import numpy as np

from engine.groups.csr import SpeechGroups


def token_group_sizes(groups: SpeechGroups) -> np.ndarray:
    """`[V]` |G(t)| for every token (deduplicated groups are looked up through `home`)."""
    sizes = groups.sizes
    return sizes if groups.home is None else sizes[groups.home]


def size_histogram(sizes: np.ndarray) -> list[dict]:
    """Counts in power-of-two bins `[1]`, `[2]`, `[3, 4]`, `[5, 8]`, ... up to the largest size."""
    bins, lo, hi = [], 1, 1
    top = int(sizes.max()) if len(sizes) else 1
    while lo <= top:
        count = int(((sizes >= lo) & (sizes <= hi)).sum())
        bins.append({"min": lo, "max": hi, "groups": count})
        lo, hi = hi + 1, hi * 2
    return bins


def range_stats(groups: SpeechGroups, sizes: np.ndarray) -> list[dict]:
    """`group_stats`' size figures for the tokens of each code range."""
    out = []
    for start, size in groups.code_ranges:
        part = sizes[start:start + size]
        singletons = int((part == 1).sum())
        full = None if groups.full_sizes is None else groups.full_sizes[start:start + size]
        out.append({"start": start, "size": size, "mean_size": round(float(part.mean()), 4),
                    "median_size": float(np.median(part)), "p99_size": float(np.percentile(part, 99)),
                    "max_size": int(part.max()), "singletons": singletons,
                    "coverage": round(1.0 - singletons / size, 6),
                    "truncated": 0 if full is None else int((full > groups.max_group_size).sum())})
    return out


def group_stats(groups: SpeechGroups) -> dict:
    """Sizes of the per-token groups G(t), singletons, coverage, truncation and storage bytes;
    with several code ranges also those of each range (`ranges`).

    `coverage` is the fraction of tokens whose group holds another token, i.e. tokens PCG can
    stand in for; the rest behave exactly as under standard speculative decoding.
    """
    sizes = token_group_sizes(groups)
    singletons = int((sizes == 1).sum())
    per_range = range_stats(groups, sizes) if len(groups.code_ranges) > 1 else None
    return {
        "num_tokens": groups.num_tokens,
        "num_groups": groups.num_groups,
        "nnz": int(groups.indptr[-1]),
        "mean_size": round(float(sizes.mean()), 4),
        "median_size": float(np.median(sizes)),
        "p99_size": float(np.percentile(sizes, 99)),
        "max_size": int(sizes.max()),
        "singletons": singletons,
        "coverage": round(1.0 - singletons / groups.num_tokens, 6),
        "truncated": groups.truncated,
        "csr_bytes": int(groups.indptr.nbytes + groups.members.nbytes),
        "histogram": size_histogram(sizes),
        **({"ranges": per_range} if per_range else {}),
    }


def format_stats(stats: dict, title: str = "") -> str:
    """A readable block for the terminal."""
    lines = [title] if title else []
    lines.append(f"tokens {stats['num_tokens']}  groups {stats['num_groups']}  "
                 f"members {stats['nnz']}  CSR bytes {stats['csr_bytes']}")
    lines.append(f"size mean {stats['mean_size']:.2f}  median {stats['median_size']:g}  "
                 f"p99 {stats['p99_size']:g}  max {stats['max_size']}")
    lines.append(f"singletons {stats['singletons']}  coverage {stats['coverage']:.4f}  "
                 f"truncated {stats['truncated']}")
    lines.append("size histogram:")
    peak = max(b["groups"] for b in stats["histogram"]) or 1
    for b in stats["histogram"]:
        label = str(b["min"]) if b["min"] == b["max"] else f"{b['min']}-{b['max']}"
        bar = "#" * round(40 * b["groups"] / peak)
        lines.append(f"  {label:>11s} {b['groups']:8d} {bar}")
    if stats.get("ranges"):
        lines += format_ranges(stats["ranges"])
    return "\n".join(lines)


def format_ranges(ranges: list[dict]) -> list[str]:
    """One line per code range."""
    head = f"  {'range':>13s} {'codes':>6s} {'mean':>7s} {'median':>6s} {'p99':>6s} {'max':>5s} " \
           f"{'singletons':>10s} {'coverage':>8s} {'truncated':>9s}"
    lines = ["per code range:", head]
    for r in ranges:
        span = f"{r['start']}..{r['start'] + r['size'] - 1}"
        lines.append(f"  {span:>13s} {r['size']:6d} {r['mean_size']:7.2f} {r['median_size']:6g} "
                     f"{r['p99_size']:6g} {r['max_size']:5d} {r['singletons']:10d} {r['coverage']:8.4f} "
                     f"{r['truncated']:9d}")
    return lines
