"""`pcg-synth bench`: tokens/s of the acceptance rules over batch sizes, gamma and theta.

Within one batch size, every repetition runs every setting once over the same items and seed,
in an order rotated per repetition, and each setting's speedup is its tokens/s over `ar`'s in
the same repetition, so drift of the machine cancels. A short warm-up of every setting is
excluded. Medians and min/max over repetitions are kept; the cost model adds step times.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from tqdm.auto import tqdm

from engine.api import Synthesizer
from engine.bench.texts import BENCH_TEXTS
from engine.config import METHODS, DecodingSettings, decoding_default
from engine.console import bar_disabled
from engine.decoding.cost import ForwardClock
from engine.records import RunSummary, SynthesisItem


@dataclass(frozen=True)
class Setting:
    """One operating point: a rule, its gamma, (for `pcg`) theta, and whether stream heads draft
    it instead of the draft model (`heads`, a run given both)."""

    method: str
    gamma: int | str = 0  # a draft length, or "auto"
    theta: float | None = None
    heads: bool = False

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "ar"
        gamma = "auto" if self.gamma == "auto" else f"g{self.gamma}"
        drafter = " heads" if self.heads else ""
        return f"{self.method}{drafter} {gamma}" + (f" t{self.theta:g}" if self.theta is not None else "")


@dataclass
class BenchConfig:
    """What to measure (defaults: the committed CPU run)."""

    methods: tuple[str, ...] = METHODS
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    gammas: tuple[int | str, ...] = (decoding_default("gamma"),)  # ints and/or "auto"
    thetas: tuple[float, ...] = (decoding_default("theta"),)
    reps: int = 3
    max_new_tokens: int = 64
    items_per_slot: int = 2  # items = this x batch size: continuous batching refills slots
    temperature: float = decoding_default("temperature")
    beta: float = decoding_default("beta")
    topk: int = decoding_default("topk")
    cost_model: bool = True
    cost_reps: int = 10
    context: int | None = None  # KV length for step timing; default: mean prompt + half the budget
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        bad = set(self.methods) - set(METHODS)
        if bad:
            raise ValueError(f"unknown method(s) {', '.join(sorted(bad))}; choose from {', '.join(METHODS)}")
        if any(g != "auto" and not (isinstance(g, int) and g >= 1) for g in self.gammas):
            raise ValueError(f"gammas are integers >= 1 or 'auto'; got {list(self.gammas)}")
        if self.reps < 1 or min(self.batch_sizes) < 1:
            raise ValueError("reps and batch sizes must be >= 1")
        if any(not 0 < t <= 1 for t in self.thetas):
            raise ValueError("theta must lie in (0, 1]")


def grid(cfg: BenchConfig, heads: int = 0) -> list[Setting]:
    """`ar` first (the baseline is always measured), then every method x gamma (x theta) with the
    draft model, then with `heads` stream heads when given (gammas above their count skipped:
    they propose no more)."""
    out = [Setting("ar")]
    for drafted_by_heads in (False, True) if heads else (False,):
        for m in cfg.methods:
            if m == "ar":
                continue
            for g in cfg.gammas:
                if drafted_by_heads and g != "auto" and g > heads:
                    continue
                thetas = cfg.thetas if m == "pcg" else (None,)
                out.extend(Setting(m, g, t, drafted_by_heads) for t in thetas)
    return out


def decoding(s: Setting, cfg: BenchConfig, seed: int, max_new: int) -> DecodingSettings:
    fields = dict(method=s.method, temperature=cfg.temperature, beta=cfg.beta, topk=cfg.topk,
                  max_new_tokens=max_new, seed=seed)
    if s.gamma:
        fields["gamma"] = s.gamma
    if s.theta is not None:
        fields["theta"] = s.theta
    return DecodingSettings(**fields)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def timed_runs(synths: dict[bool, Synthesizer], batch: int, settings: list[Setting], cfg: BenchConfig,
               bar: tqdm) -> dict[str, list[dict]]:
    """Run summaries per setting label: warm-up excluded, order rotated per repetition
    (`synths[s.heads]` runs setting `s`: the draft model's, or the stream heads')."""
    items = [SynthesisItem(text=BENCH_TEXTS[i % len(BENCH_TEXTS)], id=f"u{i}")
             for i in range(cfg.items_per_slot * batch)]
    for s in settings:  # warm-up: caches, groups, kernels
        synths[s.heads].synthesize(items[:batch], decoding(s, cfg, 0, 8), batch_size=batch)
        bar.update(1)
    runs: dict[str, list[dict]] = {s.label: [] for s in settings}
    for rep in range(cfg.reps):
        k = rep % len(settings)
        for s in settings[k:] + settings[:k]:
            synth = synths[s.heads]
            before = synth.runner.stats.to_dict()
            with ForwardClock(synth.target.model, synth.drafter) as clock:
                _, summary = synth.synthesize(items, decoding(s, cfg, rep, cfg.max_new_tokens), batch_size=batch)
            runs[s.label].append({**timed_summary(summary, clock), **round_delta(before, synth.runner.stats)})
            bar.update(1)
    return runs


def round_delta(before: dict, stats) -> dict:
    """A run's rounds as the round runner saw them (`RoundStats` before and after): host and device
    milliseconds per round, graph launches per round, and the ops a round dispatches (counted on a
    plan's second round)."""
    now = stats.to_dict()
    rounds = max(now["rounds"] - before["rounds"], 1)
    device = now["device_s"] - before["device_s"]
    return {"round_host_ms": 1e3 * (now["host_s"] - before["host_s"]) / rounds,
            "round_device_ms": 1e3 * device / rounds if device else None,
            "graph_launches_per_round": (now["graph_launches"] - before["graph_launches"]) / rounds,
            "ops_per_round": now["ops_per_round"], "compile_mode": now["mode"]}


def timed_summary(summary: RunSummary, clock: ForwardClock) -> dict:
    """A run's summary plus where its time went: prefill forwards, decode forwards, and the
    host's work per decode round (wall - forwards); decode tokens/s leaves prefill out."""
    run = summary.to_dict()
    decode_wall = max(run["wall_s"] - clock.prefill_s, 1e-9)
    rounds = max(summary.decode_rounds, 1)
    host = max(decode_wall - clock.decode_s, 0.0)
    return {**run, "prefill_s": clock.prefill_s, "decode_forward_s": clock.decode_s, "host_s": host,
            "host_s_per_round": host / rounds, "forward_s_per_round": clock.decode_s / rounds,
            "decode_tokens_per_s": run["generated_tokens"] / decode_wall}


def aggregate(runs: dict[str, list[dict]], settings: list[Setting]) -> dict[str, dict]:
    """Medians/spreads per setting; speedup against `ar` of the same repetition."""
    base = runs["ar"]
    out = {}
    for s in settings:
        rows = runs[s.label]
        tps = [r["tokens_per_s"] for r in rows]
        acc = [r["acceptance_per_position"] for r in rows if r["acceptance_per_position"]]
        tokens = sum(r["generated_tokens"] for r in rows)
        out[s.label] = {
            **asdict(s),
            "tokens_per_s": spread(tps),
            "audio_s_per_s": spread([r["tokens_per_s"] / r["codes_per_second"] for r in rows]),
            "speedup_vs_ar": spread([r["tokens_per_s"] / a["tokens_per_s"] for r, a in zip(rows, base)]),
            "decode_speedup_vs_ar": spread([r["decode_tokens_per_s"] / a["decode_tokens_per_s"]
                                            for r, a in zip(rows, base)]),
            "host_s_per_round": spread([r["host_s_per_round"] for r in rows]),
            "round_host_ms": spread([r["round_host_ms"] for r in rows]),
            "round_device_ms": spread([r["round_device_ms"] for r in rows]) if rows[0]["round_device_ms"] else None,
            "graph_launches_per_round": statistics.fmean(r["graph_launches_per_round"] for r in rows),
            "ops_per_round": rows[-1]["ops_per_round"],
            "forward_s_per_round": spread([r["forward_s_per_round"] for r in rows]),
            "prefill_share": statistics.fmean(r["prefill_s"] / r["wall_s"] for r in rows),
            "mean_accepted_length": spread([r["mean_accepted_length"] for r in rows]),
            "acceptance_per_position": [statistics.fmean(x) for x in zip(*acc)] if acc else [],
            "thinning_trials_per_rep": statistics.fmean(r["thinning_trials"] for r in rows),
            "thinning_trials_per_token": sum(r["thinning_trials"] for r in rows) / max(tokens, 1),
            "fallbacks_per_rep": statistics.fmean(r["fallbacks"] for r in rows),
            "generated_tokens_per_rep": tokens / len(rows),
        }
        chosen = [r["gamma_choice"]["gamma"] for r in rows if r.get("gamma_choice")]
        if chosen:  # gamma: auto (0: speculation switched off, the rows decoded with `ar`)
            out[s.label]["chosen_gamma"] = statistics.mode(chosen)
            out[s.label]["gamma_choice_reason"] = rows[-1]["gamma_choice"]["reason"]
    return out


def default_context(synth: Synthesizer, cfg: BenchConfig) -> int:
    """Mean prompt length of the bench texts plus half the generation budget."""
    lengths = [len(synth.prompter.build(t)) for t in BENCH_TEXTS]
    return int(statistics.fmean(lengths)) + cfg.max_new_tokens // 2


def cost_model(synth: Synthesizer, batch: int, cfg: BenchConfig, context: int, bandwidth: float,
               also: tuple[int, ...] = ()) -> dict:
    """Step times per gamma at this batch size (the grid's gammas in order, then those of
    `also`, the ones `gamma: auto` chose, that the grid lacks), and the bandwidth bound of a
    target step compared with the `ar` step timed beside the grid's first gamma (so what `auto`
    chose on this run changes neither that reading nor which steps come first)."""
    from engine.decoding import cost

    draft = synth.drafter
    most = draft.heads if synth.drafter_kind == "streams" else None  # heads propose no more than their count
    fixed = sorted({g for g in cfg.gammas if g != "auto" and 0 < g <= (most or g)})
    gammas = fixed + sorted({g for g in also if g > 0} - set(fixed)) or [1]
    per_gamma = {str(g): cost.step_times(synth.target.model, draft, batch, g, context, cfg.cost_reps)
                 for g in gammas}
    bound = cost.bandwidth_bound(synth.target.model, batch, context, bandwidth)
    ar_s = next(iter(per_gamma.values()))["ar_s"]
    bound["ar_step_over_weights_bound"] = ar_s / bound["weights_bound_s"]
    return {"context": context, "steps": per_gamma, "bound": bound}


def run_bench(synth: Synthesizer, cfg: BenchConfig, models: dict, how: str, progress: bool = True,
              heads: Synthesizer | None = None) -> dict:
    """The whole grid; returns the result document (see `analysis.derive` for its readings).
    `heads`: a Synthesizer over the same target drafting with stream heads: every speculative
    setting is measured with it too, interleaved with the draft model's, and gets its own cost
    model (`cost_heads`)."""
    from engine.bench.analysis import derive
    from engine.bench.machine import describe
    from engine.decoding import cost

    cfg.check()
    settings = grid(cfg, heads.drafter.heads if heads is not None else 0)
    synths = {False: synth, True: heads}
    device = synth.device
    context = cfg.context or default_context(synth, cfg)
    bandwidth = cost.measured_bandwidth(device) if cfg.cost_model else None
    doc = {
        "benchmark": "decoding speed per acceptance rule (pcg-synth bench)",
        "how": how,
        "machine": {**describe(device), "copy_bandwidth_GBps": bandwidth / 1e9 if bandwidth else None,
                    "spec_bandwidth_GBps": (cost.spec_bandwidth(device) or 0) / 1e9 or None},
        "models": {**models, "family": synth.family.name},
        "settings": {**asdict(cfg), "items_per_run": f"{cfg.items_per_slot} x batch size",
                     "texts": "engine/bench/texts.py (8 English sentences)"},
        "batches": {},
    }
    total = len(cfg.batch_sizes) * len(settings) * (cfg.reps + 1)
    with tqdm(total=total, desc="bench", unit="run", disable=bar_disabled(progress)) as bar:
        for batch in cfg.batch_sizes:
            runs = timed_runs(synths, batch, settings, cfg, bar)
            entry = {"runs": aggregate(runs, settings)}
            if cfg.cost_model:
                bar.set_postfix_str(f"cost model, batch {batch}")
                for key, drafted_by_heads in (("cost", False), ("cost_heads", True)) if heads else (("cost", False),):
                    chosen = tuple(r["chosen_gamma"] for r in entry["runs"].values()
                                   if r.get("chosen_gamma") and r["heads"] == drafted_by_heads)
                    entry[key] = cost_model(synths[drafted_by_heads], batch, cfg, context, bandwidth, chosen)
            doc["batches"][str(batch)] = entry
    doc["readings"] = derive(doc)
    return doc
