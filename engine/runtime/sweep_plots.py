"""PNG plots of a sweep: scaling with workers, throughput by batch size, acceptance by theta."""

from __future__ import annotations

import io
import statistics
from collections import defaultdict

from engine.io.storage import Storage, join
from engine.metrics.deps import require


def label(r: dict) -> str:
    extra = "".join(f" {k[0]}={r[k]}" for k in ("gamma", "theta") if r[k] is not None)
    return f"{r['pair']} {r['method']}{extra}"


def median_by(rows: list[dict], x: str, value: str = "tokens_per_s") -> dict[str, dict]:
    """{series label: {x value: median of `value`}} over repetitions."""
    acc: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        acc[label(r)][r[x]].append(r[value] or 0.0)
    return {k: {xv: statistics.median(v) for xv, v in sorted(d.items())} for k, d in acc.items()}


def save(fig, plt, storage: Storage, uri: str) -> str:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    storage.write_bytes(uri, buffer.getvalue())
    return uri


def plot_sweep(rows: list[dict], storage: Storage, folder: str) -> list[str]:
    """Write the plots the grid supports; returns their URIs."""
    matplotlib = require("matplotlib", "matplotlib", "bench", "sweep plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    workers = sorted({r["workers"] for r in rows})
    if len(workers) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, series in median_by([r for r in rows if r["batch_size"] == max(r2["batch_size"] for r2 in rows)],
                                      "workers").items():
            xs = list(series)
            ax.plot(xs, list(series.values()), marker="o", label=name)
            ax.plot(xs, [series[xs[0]] * w / xs[0] for w in xs], linestyle=":", color="grey")
        ax.set(xlabel="workers", ylabel="tokens/s (steady)", title="Throughput vs workers (dotted: linear)")
        ax.legend(fontsize=7)
        written.append(save(fig, plt, storage, join(folder, "throughput_vs_workers.png")))
    if len({r["batch_size"] for r in rows}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, series in median_by([r for r in rows if r["workers"] == workers[0]], "batch_size").items():
            ax.plot(list(series), list(series.values()), marker="o", label=name)
        ax.set(xlabel="batch size", ylabel="tokens/s (steady)",
               title=f"Throughput vs batch size ({workers[0]} worker(s))")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
        written.append(save(fig, plt, storage, join(folder, "throughput_vs_batch.png")))
    pcg = [dict(r, acceptance=sum(r["acceptance_per_position"]) / len(r["acceptance_per_position"]))
           for r in rows if r["method"] == "pcg" and r["acceptance_per_position"]]
    if pcg:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        by_theta: dict[float, list[float]] = defaultdict(list)
        for r in pcg:
            by_theta[r["theta"]].append(r["acceptance"])
        thetas = sorted(by_theta)
        ax.plot(thetas, [statistics.median(by_theta[t]) for t in thetas], marker="o", label="pcg")
        ax.set(xlabel="theta", ylabel="mean acceptance per position", title="Acceptance vs theta")
        ax.legend(fontsize=7)
        written.append(save(fig, plt, storage, join(folder, "acceptance_vs_theta.png")))
    return written
