"""PNG plots of bench and paper-table results (matplotlib, the `bench` extra)."""

from __future__ import annotations

from pathlib import Path

from engine.metrics.deps import require


def _pyplot():
    matplotlib = require("matplotlib", "matplotlib", "bench", "plots")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _title(doc: dict) -> str:
    mc = doc["machine"]
    return f"{doc['models'].get('preset') or doc['models']['target']} on {mc.get('gpu') or mc['cpu']}"


def speedup_vs_batch(doc: dict, path: Path) -> Path:
    """Median speedup over `ar` (min-max bars) against batch size, one line per setting."""
    plt = _pyplot()
    batches = sorted(doc["batches"], key=int)
    labels = [lb for lb in doc["batches"][batches[0]]["runs"] if lb != "ar"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        runs = [doc["batches"][b]["runs"][label]["speedup_vs_ar"] for b in batches]
        med = [r["median"] for r in runs]
        err = [[m - r["min"] for m, r in zip(med, runs)], [r["max"] - m for m, r in zip(med, runs)]]
        ax.errorbar([int(b) for b in batches], med, yerr=err, marker="o", capsize=3, label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="ar")
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(b) for b in batches], [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s relative to ar (same repetition)")
    ax.set_title(f"Speedup vs batch size: {_title(doc)}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def acceptance_vs_theta(doc: dict, path: Path) -> Path:
    """Mean per-position acceptance of `pcg` against theta (all batch sizes pooled), with the
    theta-free rules as horizontal references; settings drafted by stream heads are lines of
    their own (`heads`)."""
    plt = _pyplot()
    pooled: dict[tuple, list[float]] = {}
    for entry in doc["batches"].values():
        for run in entry["runs"].values():
            if run["acceptance_per_position"]:
                key = (run["method"], (run["gamma"], run.get("heads", False)), run["theta"])
                rate = sum(run["acceptance_per_position"]) / len(run["acceptance_per_position"])
                pooled.setdefault(key, []).append(rate)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    thetas = sorted({k[2] for k in pooled if k[0] == "pcg"})
    for gamma, heads in sorted({k[1] for k in pooled}, key=str):  # draft lengths, then "auto"
        name = f"{' heads' if heads else ''} g{gamma}"
        ys = [sum(pooled[("pcg", (gamma, heads), t)]) / len(pooled[("pcg", (gamma, heads), t)]) for t in thetas
              if ("pcg", (gamma, heads), t) in pooled]
        if ys:
            ax.plot(thetas[: len(ys)], ys, marker="o", label=f"pcg{name}")
        for method in ("exact", "ssd", "topk"):
            if (method, (gamma, heads), None) in pooled:
                vals = pooled[(method, (gamma, heads), None)]
                ax.axhline(sum(vals) / len(vals), linestyle="--" if heads else ":", linewidth=1,
                           label=f"{method}{name}",
                           color={"exact": "black", "ssd": "tab:red", "topk": "tab:purple"}[method])
    ax.set_xlabel("theta (group cosine threshold)")
    ax.set_ylabel("acceptance rate (mean over draft positions)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Acceptance vs theta: {_title(doc)}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def quality_vs_speedup(table: dict, path: Path, metric: str = "wer") -> Path:
    """WER (or another metric) against speedup, mean +- std over seeds, one point per method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method, row in table["rows"].items():
        sp, q = row.get("speedup"), row.get(metric)
        if not sp or not q or sp["mean"] is None or q["mean"] is None:
            continue
        ax.errorbar(sp["mean"], q["mean"], xerr=sp["std"], yerr=q["std"], marker="o", capsize=3)
        ax.annotate(method, (sp["mean"], q["mean"]), textcoords="offset points", xytext=(6, 6))
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("speedup vs ar (tokens/s ratio)")
    ax.set_ylabel(f"{metric.upper()} %" if metric in ("wer", "cer") else metric)
    ax.set_title(f"Quality vs speed: {table['models'].get('target')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_plots(doc: dict, stem: Path) -> list[Path]:
    """Both bench plots next to `stem` (`stem_speedup_vs_batch.png`, `stem_acceptance_vs_theta.png`)."""
    return [speedup_vs_batch(doc, stem.with_name(stem.name + "_speedup_vs_batch.png")),
            acceptance_vs_theta(doc, stem.with_name(stem.name + "_acceptance_vs_theta.png"))]
