"""X-codec2 decode throughput (audio seconds per wall second) by batch size.

Two codecs with random weights (throughput does not depend on the weights' values): the tiny
kit codec (hidden 64, 2 layers) and the full-size X-codec2 decoder (hidden 1024, 12 layers,
~187 M parameters; the encoder is never built). Every item of a batch has the same number of
codes, as the engine batches them. One untimed call per shape warms up kernels.

    python benchmarks/bench_codec.py --device cpu --out benchmarks/results/codec_cpu.json
    python benchmarks/bench_codec.py --device cuda --full-batches 1,8,32 \
        --out benchmarks/results/codec_cuda.json

On a CPU shared with other processes, OpenMP's default busy-waiting makes 2-thread runs up to
100x slower; the script sets OMP_WAIT_POLICY=PASSIVE unless it is set (recorded in the file).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.codec.xcodec2 import Xcodec2Codec  # noqa: E402
from engine.families.llasa import FAMILY as LLASA  # noqa: E402

from machine import describe, write_result  # noqa: E402

CODES_PER_SECOND = LLASA.codes_per_second  # the X-codec2 codes Llasa emits


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batch(codec: Xcodec2Codec, batch: int, n_codes: int, repeats: int) -> dict:
    """Median wall time of decoding `batch` items of `n_codes` codes each (one batch)."""
    codes = np.random.default_rng(0).integers(0, codec.codebook_size, (batch, n_codes))
    codec.decode_batch(codes)  # warm-up: kernel selection, allocator
    times = []
    for _ in range(repeats):
        sync(codec.device)
        start = time.perf_counter()
        audio = codec.decode_batch(codes)  # includes the copy to host memory
        sync(codec.device)
        times.append(time.perf_counter() - start)
    assert audio.shape == (batch, n_codes * codec.frame_samples)
    median = statistics.median(times)
    audio_s = batch * n_codes / CODES_PER_SECOND
    row = {"batch": batch, "codes_per_item": n_codes, "audio_s_per_item": round(n_codes / CODES_PER_SECOND, 6),
           "repeats": repeats, "median_s": round(median, 5), "min_s": round(min(times), 5),
           "audio_s_per_s": round(audio_s / median, 2)}
    if codec.device.type == "cuda":
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(codec.device) / 2**30, 3)
    return row


def tiny_codec(device: str, dtype: str, workdir: Path) -> Xcodec2Codec:
    from engine.kit.build import KitSpec, build_codec

    build_codec(workdir / "codec", KitSpec())
    return Xcodec2Codec.load(workdir / "codec", device=device, dtype=dtype)


def full_codec(device: str, dtype: str) -> Xcodec2Codec:
    from transformers import Xcodec2Config

    return Xcodec2Codec.from_config(Xcodec2Config(), device=device, dtype=dtype)


def run(name: str, codec: Xcodec2Codec, batches: list[int], n_codes: int, repeats: int) -> list[dict]:
    params = sum(p.numel() for p in codec.parts.parameters())
    rows = []
    for b in batches:
        row = {"codec": name, "parameters": params, "dtype": str(codec.dtype).removeprefix("torch."),
               **time_batch(codec, b, n_codes, repeats)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16")
    p.add_argument("--seconds", type=float, default=5.0, help="audio per item (tiny codec)")
    p.add_argument("--batches", default="1,8,32", help="tiny codec batch sizes")
    p.add_argument("--full-seconds", type=float, default=2.0, help="audio per item (full size)")
    p.add_argument("--full-batches", default="1", help="full-size batch sizes ('' skips it)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--full-repeats", type=int, default=3)
    p.add_argument("--note", help="a remark stored in the result file (e.g. what is pending)")
    p.add_argument("--out", help="write results JSON here")
    args = p.parse_args()
    machine = describe(args.device) | {
        "transformers": __import__("transformers").__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_start": os.getloadavg()[0],
    }
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        codec = tiny_codec(args.device, args.dtype, Path(tmp))
        results += run("tiny-kit", codec, ints(args.batches), round(args.seconds * CODES_PER_SECOND),
                       args.repeats)
    if ints(args.full_batches):
        codec = full_codec(args.device, args.dtype)
        results += run("xcodec2-full-random", codec, ints(args.full_batches),
                       round(args.full_seconds * CODES_PER_SECOND), args.full_repeats)
    machine["load_average_end"] = os.getloadavg()[0]
    doc = {"benchmark": "codec_decode", "unit": "audio seconds decoded per wall-clock second",
           "machine": machine, "results": results}
    if args.note:
        doc["note"] = args.note
    write_result(doc, args.out)


if __name__ == "__main__":
    main()
