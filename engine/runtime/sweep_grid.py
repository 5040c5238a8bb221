"""A sweep's grid: its points, their ids and job specs, the order its runs are measured in, and
where each run writes. Imports no torch or Ray (`pcg-synth run --dry-run` counts a sweep's runs
with it; `engine.runtime.sweep` runs them)."""

from __future__ import annotations

import itertools

from engine.config import JobSpec, ModelPair
from engine.io.storage import join


def points(spec: JobSpec) -> list[dict]:
    """The grid, without points that cannot differ (`ar` has no gamma or theta; only `pcg` has
    a theta; pairs without a draft run `ar` only)."""
    sw = spec.sweep
    pairs = sw.model_pairs or [ModelPair(name="models", target=spec.models.target, draft=spec.models.draft)]
    out = []
    for pair, workers, batch, method in itertools.product(pairs, sw.workers, sw.batch_sizes, sw.methods):
        if method != "ar" and pair.draft is None:
            continue
        gammas = [None] if method == "ar" else sw.gammas
        thetas = sw.thetas if method == "pcg" else [None]
        for gamma, theta in itertools.product(gammas, thetas):
            out.append({"pair": pair, "workers": workers, "batch_size": batch, "method": method,
                        "gamma": gamma, "theta": theta})
    return out


def point_id(p: dict) -> str:
    parts = [p["pair"].name, f"w{p['workers']}", f"b{p['batch_size']}", p["method"]]
    parts += [f"g{p['gamma']}"] if p["gamma"] is not None else []
    parts += [f"t{p['theta']}"] if p["theta"] is not None else []
    return "-".join(parts)


def point_spec(spec: JobSpec, p: dict, uri: str) -> JobSpec:
    decoding = {"method": p["method"]}
    decoding.update({k: p[k] for k in ("gamma", "theta") if p[k] is not None})
    models = {"target": p["pair"].target, "draft": p["pair"].draft}
    return spec.model_copy(update={
        "kind": "synthesize", "sweep": None, "name": f"{spec.name}-{point_id(p)}",
        "models": spec.models.model_copy(update=models),
        "decoding": spec.decoding.model_copy(update=decoding),
        "resources": spec.resources.model_copy(update={"workers": p["workers"], "batch_size": p["batch_size"]}),
        "output": spec.output.model_copy(update={"uri": uri})})


def schedule(grid: list[dict], repetitions: int) -> list[tuple[int, dict]]:
    """The order runs are measured in: a repetition of every point, then the next, the grid
    reversed in every second one. A machine that drifts (another load, clocks, a VM's
    neighbours) then touches every point alike, and the runs that `add_speedup` compares
    run next to each other."""
    order = []
    for rep in range(repetitions):
        order += [(rep, p) for p in (grid if rep % 2 == 0 else grid[::-1])]
    return order


def run_uri(root: str, p: dict, rep: int) -> str:
    """Where repetition `rep` of point `p` writes its job output (its `summary.json` marks it done)."""
    return join(root, "points", f"{point_id(p)}-r{rep}")
