"""What the report draws and plays: histograms as inline SVG, and the rows it embeds audio for."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from html import escape

from engine.report.read import ReportRow

# (row field, title, unit): the histograms, each drawn when some row has a value for it
HISTOGRAMS = (
    ("duration", "Duration", "s"),
    ("speaking_rate", "Speaking rate", "characters/s"),
    ("acceptance", "Acceptance", "accepted / drafted"),
    ("cer", "CER (quality gate)", "fraction"),
    ("wer", "WER (quality gate)", "fraction"),
    ("speaker_similarity", "Speaker similarity (quality gate)", "cosine"),
)
# the series a histogram stacks, bottom first, and their colours (the page's legend uses them too)
SERIES = (("ok", "#3b7dd8"), ("rejected", "#e07b39"))
BINS = 24
WIDTH, HEIGHT, PAD = 360, 150, 24


def histogram_svg(title: str, unit: str, series: dict[str, Sequence[float]], bins: int = BINS) -> str:
    """An SVG histogram of `series` (name -> values) stacked in `SERIES` order over one range;
    each bar's title gives its range and counts."""
    values = [v for vs in series.values() for v in vs]
    low, high = min(values), max(values)
    if high - low < 1e-12:  # one value: one bar centred on it
        low, high = low - 0.5, high + 0.5
    step = (high - low) / bins
    counts = {name: [0] * bins for name in series}
    for name, vs in series.items():
        for v in vs:
            counts[name][min(int((v - low) / step), bins - 1)] += 1
    top = max(sum(counts[n][b] for n in counts) for b in range(bins))
    plot_w, plot_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    bar_w = plot_w / bins
    parts = [f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="t">{escape(title)} ({escape(unit)})</text>',
             f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" class="axis"/>']
    for b in range(bins):
        y = HEIGHT - PAD
        tip = [f"{low + b * step:.4g} to {low + (b + 1) * step:.4g} {unit}"]
        for name, colour in SERIES:
            n = counts.get(name, [0] * bins)[b]
            if not n:
                continue
            h = plot_h * n / top
            y -= h
            parts.append(f'<rect x="{PAD + b * bar_w + 0.5:.2f}" y="{y:.2f}" width="{max(bar_w - 1, 1):.2f}" '
                         f'height="{h:.2f}" fill="{colour}"><title>{escape(tip[0])}: {n} {name}</title></rect>')
    parts += [f'<text x="{PAD}" y="{HEIGHT - 8}" class="l">{low:.4g}</text>',
              f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" class="l" text-anchor="end">{high:.4g}</text>',
              f'<text x="{PAD - 4}" y="{PAD + 4}" class="l" text-anchor="end">{top}</text>', "</svg>"]
    return "".join(parts)


def histograms(rows: Sequence[ReportRow]) -> list[str]:
    """The SVG of every `HISTOGRAMS` field some row has a (finite) value for."""
    out = []
    for name, title, unit in HISTOGRAMS:
        series = {status: [v for r in rows if r.status == status
                           and (v := getattr(r, name)) is not None and math.isfinite(v)]
                  for status, _ in SERIES}
        if any(series.values()):
            out.append(histogram_svg(title, unit, series))
    return out


def choose_sample(rows: Sequence[ReportRow], size: int, seed: int) -> list[ReportRow]:
    """`size` rows with audio to play, drawn with `seed`: up to a quarter of them rejects and a
    quarter cut rows (reached the token limit) where the output has them, the rest among the
    other rows (and whatever a short group leaves), in the output's order."""
    rng = random.Random(seed)
    playable = [r for r in rows if r.where is not None and r.duration]
    groups = [[r for r in playable if r.status == "rejected"],
              [r for r in playable if r.status != "rejected" and r.cut],
              [r for r in playable if r.status != "rejected" and not r.cut]]
    quota = max(1, size // 4)
    chosen: list[ReportRow] = []
    for group in groups[:2]:
        chosen += rng.sample(group, min(quota, len(group), size - len(chosen)))
    picked = {id(r) for r in chosen}
    rest = [r for r in groups[2] + groups[0] + groups[1] if id(r) not in picked]
    chosen += rng.sample(rest, min(size - len(chosen), len(rest)))
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(chosen, key=lambda r: order[id(r)])
