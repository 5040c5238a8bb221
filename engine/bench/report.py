"""Markdown rendering of a bench result document."""

from __future__ import annotations


def _ms(seconds: float | None) -> str:
    return f"{1e3 * seconds:.2f}" if seconds is not None else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _f(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def header(doc: dict) -> list[str]:
    m, s, mc = doc["models"], doc["settings"], doc["machine"]
    where = mc.get("gpu") or f"{mc['cpu']}, {mc['torch_threads']} threads"
    return [
        f"# Decoding speed: {m.get('preset') or m['target']}",
        "",
        f"- machine: {where} ({mc['device']}), torch {mc['torch']}, {mc['date']}, "
        f"1-min load average at start {mc.get('load_average_1m', '-')}",
        f"- models: target {m['target']} ({m['target_params'] / 1e6:.1f} M params), draft {m['draft']} "
        f"({(m['draft_params'] or 0) / 1e6:.1f} M), {m['dtype']}"
        + (f"; draft weights {m['draft_weights']}" if m.get("draft_weights", "native") != "native" else "")
        + (f"; stream heads {m['streams']} ({m['streams_count']} heads, {m['streams_params'] / 1e6:.1f} M params: "
           "the settings named `heads` draft with them)" if m.get("streams") else ""),
        f"- settings: gamma {', '.join(map(str, s['gammas']))}; theta {', '.join(map(str, s['thetas']))}; "
        f"temperature {s['temperature']}; beta {s['beta']}; topk {s['topk']}; up to {s['max_new_tokens']} "
        f"tokens per item; {s['items_per_run']} items per run; {s['reps']} repetitions, methods "
        "interleaved (order rotated), warm-up excluded; medians [min, max]",
        f"- command: `{doc['how']}`",
        "",
    ]


def rounds_table(doc: dict) -> list[str]:
    """Per round, as the round runner saw it: the ops dispatched, graph launches, the round's host
    and device milliseconds (eager rounds are op by op; compiled rounds one graph launch each)."""
    lines = ["", "## Rounds", "", "| batch | setting | ops / round | graph launches / round | host ms / round | "
             "device ms / round |", "|---|---|---|---|---|---|"]
    for batch, entry in doc["batches"].items():
        for label, r in entry["runs"].items():
            if "round_host_ms" not in r:
                continue
            device = r.get("round_device_ms")
            device = f"{device['median']:.2f}" if device else "-"
            lines.append(f"| {batch} | {label} | {r.get('ops_per_round') or '-'} | "
                         f"{r['graph_launches_per_round']:.0f} | {r['round_host_ms']['median']:.2f} | {device} |")
    return lines if len(lines) > 5 else []


def runs_table(doc: dict) -> list[str]:
    lines = ["| batch | setting | tokens/s | audio s/s | speedup vs ar | decode-phase speedup | "
             "mean accepted length | acceptance by position | thinning trials / token | host ms / round | "
             "predicted speedup (forwards only) | drain | break-even length |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for batch, entry in doc["batches"].items():
        for label, r in entry["runs"].items():
            sp = r["speedup_vs_ar"]
            acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-"
            be = r.get("break_even_length")
            dec = r.get("decode_speedup_vs_ar", {}).get("median")
            host = r.get("host_s_per_round", {}).get("median")
            name = label + (f" (chose {r['chosen_gamma'] or 'ar'})" if "chosen_gamma" in r else "")
            lines.append(
                f"| {batch} | {name} | {r['tokens_per_s']['median']:.1f} | {r['audio_s_per_s']['median']:.2f} | "
                f"{sp['median']:.2f}x [{sp['min']:.2f}, {sp['max']:.2f}] | {_x(dec)} | "
                f"{r['mean_accepted_length']['median']:.2f} | {acc} | {r['thinning_trials_per_token']:.3f} | "
                f"{_ms(host)} | {_x(r.get('predicted_speedup'))} ({_x(r.get('predicted_speedup_forwards'))}) | "
                f"{_f(r.get('drain_factor'))} | {f'{be:.2f}' if be is not None else '-'} |")
    lines += ["", "Predicted speedup: L x (ar step + its host time) / (draft phase + verify + host time per "
              "round), times `drain` (the share left after the batch waits for its slowest row, from the "
              "acceptance; 1: no drain); in brackets the forwards alone. Step times from the cost model "
              "below, host times and L from the runs."]
    return lines


def cost_table(doc: dict) -> list[str]:
    rows = [(b, drafter, e[key]) for b, e in doc["batches"].items()
            for key, drafter in (("cost", "draft"), ("cost_heads", "heads")) if key in e]
    if not rows:
        return []
    bw = doc["machine"].get("copy_bandwidth_GBps")
    lines = ["", f"## Cost model (measured copy bandwidth {bw:.0f} GB/s)" if bw else "## Cost model", "",
             "| batch | drafter | gamma | context | ar step ms | verify ms | draft phase ms | draft step ms | "
             "break-even length | weights MB | weights bound ms | ar step / bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for batch, drafter, cost in rows:
        bound = cost["bound"]
        for gamma, t in cost["steps"].items():
            be = (t["draft_phase_s"] + t["verify_s"]) / t["ar_s"] if "draft_phase_s" in t else None
            lines.append(f"| {batch} | {drafter} | {gamma} | {cost['context']} | {_ms(t['ar_s'])} | "
                         f"{_ms(t['verify_s'])} | {_ms(t.get('draft_phase_s'))} | {_ms(t.get('draft_step_s'))} | "
                         f"{f'{be:.2f}' if be else '-'} | {bound['weight_bytes'] / 1e6:.1f} | "
                         f"{_ms(bound['weights_bound_s'])} | {bound['ar_step_over_weights_bound']:.1f} |")
    return lines


def readings(doc: dict) -> list[str]:
    r = doc["readings"]
    lines = ["", "## Where speculation stops paying", "",
             "| setting | median speedup >= 1 at batch | first batch where it is < 1 |", "|---|---|---|"]
    for label, p in r["paying_off"].items():
        pays = ", ".join(map(str, p["pays_at"])) or "none"
        stop = p["stops_paying_at"]
        stop = "none measured" if stop is None else (f"{stop} (never pays)" if not p["pays_at"] else str(stop))
        lines.append(f"| {label} | {pays} | {stop} |")
    t = r["targets"]

    def verdict(v):
        return "n/a" if v is None else ("met" if v else "not met")
    lines += ["", f"## Performance goals (batch {t['batch']} unless said)", "",
              f"- best `pcg` >= 1.3x `ar`: {verdict(t['pcg_at_least_1.3x'])} ({_x(t['pcg_speedup'])}; "
              f"the paper's 1.4x: {verdict(t['pcg_at_least_1.4x'])})",
              f"- best `pcg` above best `exact`: {verdict(t['pcg_above_exact'])} "
              f"({_x(t['pcg_speedup'])} vs {_x(t['exact_speedup'])})"]
    if "pcg_heads_over_pcg_draft" in t:
        lines.append(f"- best `pcg` with stream heads over best `pcg` with the draft model: "
                     f"{_x(t['pcg_heads_over_pcg_draft'])}")
    if "gamma_auto_at_least_0.95x" in t:
        lines.append(f"- `gamma: auto` >= 0.95x `ar` at every batch size: {verdict(t['gamma_auto_at_least_0.95x'])} "
                     f"(worst {_x(t['gamma_auto_worst_speedup'])})")
    if "predictions_within_10pct" in t:
        lines.append(f"- cost model within 10% of the measured decode-phase speedup, every row: "
                     f"{verdict(t['predictions_within_10pct'])} (worst {100 * t['worst_prediction_error']:.1f}%)")
    if "target_step_over_weights_bound" in t:
        lines.append(f"- `ar` step within 1.5x of the weight-bandwidth bound: "
                     f"{verdict(t['target_step_within_1.5x_of_bound'])} ({t['target_step_over_weights_bound']:.2f}x)")
        lines.append(f"- verify step no slower than an `ar` step: {verdict(t['verify_not_slower_than_ar'])} "
                     f"({t['verify_over_ar_step']:.2f}x)")
    return lines


def markdown(doc: dict) -> str:
    return "\n".join(header(doc) + runs_table(doc) + rounds_table(doc) + cost_table(doc) + readings(doc)) + "\n"
