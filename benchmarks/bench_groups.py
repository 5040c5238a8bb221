"""Groups build time at Llasa-1B's shape (65,536 speech tokens x 2,048 hidden), random embeddings.

    python benchmarks/bench_groups.py --workers 1,2 --in-process \
        --out benchmarks/results/groups_cpu.json

Times `build_groups` in this process and `build_groups_distributed` with N Ray workers (actor
start-up included, cluster start-up reported separately) and checks that every run gives the
same groups. Random rows at D = 2048 have cosines ~N(0, 1/2048), so at theta 0.4 every group is
a singleton: this measures the search (a 65,536^2 x 2,048 inner-product scan, 17.6 TFLOP), which
dominates real builds too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe, write_result  # noqa: E402


def machine() -> dict:
    import faiss
    import ray

    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return {**describe("cpu"), "memory_gib": round(mem / 2**20, 1), "faiss": faiss.__version__,
            "ray": ray.__version__, "numpy": np.__version__}


def load_note(runs: list[dict]) -> str:
    """What the 1-minute load averages say about the machine during the runs."""
    peak = max((max(r["load_avg_1m_before"], r["load_avg_1m_after"]) for r in runs), default=0.0)
    if peak > (os.cpu_count() or 1) + 0.5:  # more than the benchmark's own threads
        return f"other processes ran concurrently (1-minute load up to {peak}); timings are upper bounds"
    return f"no other load (1-minute load average at most {peak}, the benchmark's own included)"


def timed(label: str, fn, flops: float) -> tuple[dict, object]:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    groups = fn()
    seconds = time.perf_counter() - start
    row = {"run": label, "seconds": round(seconds, 2), "effective_gflops": round(flops / seconds / 1e9, 1),
           "backend": groups.meta.get("backend"), "mean_size": round(float(groups.sizes.mean()), 4),
           "nnz": int(groups.indptr[-1]), "truncated": groups.truncated,
           "load_avg_1m_before": round(load, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}
    print(json.dumps(row), flush=True)
    return row, groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--theta", type=float, default=0.4)
    parser.add_argument("--workers", default="1,2", help="comma-separated Ray worker counts")
    parser.add_argument("--in-process", action="store_true", help="also time the in-process build")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    import ray

    from engine.groups.build import build_groups
    from engine.groups.distributed import build_groups_distributed
    from engine.groups.options import GroupsBuild

    emb = np.random.default_rng(args.seed).standard_normal((args.tokens, args.dim), dtype=np.float32)
    flops = 2.0 * args.tokens * args.tokens * args.dim
    runs, results = [], []
    if args.in_process:
        row, groups = timed(f"in-process ({os.cpu_count()} threads)",
                            lambda: build_groups(emb, args.theta, backend=args.backend), flops)
        runs.append(row)
        results.append(groups)
    counts = [int(w) for w in args.workers.split(",") if w]
    start = time.perf_counter()
    ray.init(address="local", num_cpus=max(counts + [1]), include_dashboard=False, log_to_driver=False)
    ray_start = round(time.perf_counter() - start, 2)
    for n in counts:
        row, groups = timed(f"ray, {n} CPU worker{'s' if n > 1 else ''} (1 thread each)",
                            lambda n=n: build_groups_distributed(
                                emb, GroupsBuild(args.theta, backend=args.backend, workers=n)), flops)
        runs.append(row)
        results.append(groups)
    ray.shutdown()
    identical = all(np.array_equal(g.indptr, results[0].indptr)
                    and np.array_equal(g.members, results[0].members) for g in results)
    doc = {"how": "python " + " ".join(sys.argv), "benchmark": "groups build", "shape": [args.tokens, args.dim],
           "theta": args.theta,
           "embeddings": f"standard normal float32, seed {args.seed}", "flop": flops,
           "machine": machine(), "ray_init_seconds": ray_start, "runs": runs,
           "all_runs_identical": identical,
           "gpu": "pending: no GPU was available in this session (run with --workers 1 on a CUDA "
                  "machine: one actor per GPU, faiss GPU build or torch)",
           "note": load_note(runs)}
    write_result(doc, args.out)


if __name__ == "__main__":
    main()
