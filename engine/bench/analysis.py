"""Readings of a bench result: predicted speedups, where speculation stops paying, targets."""

from __future__ import annotations

from engine.decoding.cost import break_even_length, predicted_speedup


def predictions(doc: dict) -> None:
    """Add the cost model's predicted speedup and break-even length to every speculative run."""
    for entry in doc["batches"].values():
        if "cost" not in entry:
            continue
        for run in entry["runs"].values():
            times = entry["cost"]["steps"].get(str(run["gamma"]))
            if run["method"] == "ar" or times is None:
                continue
            run["predicted_speedup"] = predicted_speedup(run["mean_accepted_length"]["median"], run["gamma"], times)
            run["break_even_length"] = break_even_length(times)


def paying_off(doc: dict) -> dict[str, dict]:
    """Per setting: batch sizes where its median speedup is >= 1, and the first batch size
    (ascending) from which it no longer is."""
    out: dict[str, dict] = {}
    for batch in sorted(doc["batches"], key=int):
        for label, run in doc["batches"][batch]["runs"].items():
            if run["method"] == "ar":
                continue
            entry = out.setdefault(label, {"pays_at": [], "stops_paying_at": None})
            if run["speedup_vs_ar"]["median"] >= 1.0:
                entry["pays_at"].append(int(batch))
            elif entry["stops_paying_at"] is None:
                entry["stops_paying_at"] = int(batch)
    return out


def targets(doc: dict) -> dict:
    """The project's performance targets read off the smallest batch size (meant for the
    `llasa-1b-shape` preset on a GPU; computed for any run)."""
    batch = min(doc["batches"], key=int)
    runs = doc["batches"][batch]["runs"]
    best = {m: max((r["speedup_vs_ar"]["median"] for r in runs.values() if r["method"] == m), default=None)
            for m in ("pcg", "exact")}
    out = {"batch": int(batch), "pcg_speedup": best["pcg"], "exact_speedup": best["exact"],
           "pcg_at_least_1.4x": None if best["pcg"] is None else best["pcg"] >= 1.4,
           "pcg_above_exact": None if None in best.values() else best["pcg"] > best["exact"]}
    cost = doc["batches"][batch].get("cost")
    if cost:
        ratio = cost["bound"]["ar_step_over_weights_bound"]
        out["target_step_over_weights_bound"] = ratio
        out["target_step_within_2x_of_bound"] = ratio <= 2.0
    return out


def derive(doc: dict) -> dict:
    predictions(doc)
    return {"paying_off": paying_off(doc), "targets": targets(doc)}
