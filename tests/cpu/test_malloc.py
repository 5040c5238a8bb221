"""The C allocator's settings for CPU decoding (`engine.models.malloc`): memory a round frees stays
with the process, on the main thread and on a thread of its own (a job worker's decode loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.models import malloc

glibc = pytest.mark.skipif(not malloc.is_glibc(), reason="the settings are glibc's")

# Rounds of blocks (by default of 8-23 MiB, 93 MiB at once), written and freed, as a decode round's
# vocabulary-wide temporaries are; minor page faults over 10 rounds after a first one.
PROBE = r"""
import ctypes, json, resource, sys, threading
from engine.models.malloc import described, keep_freed_memory
applied = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZES = json.loads(sys.argv[1])
def round_():
    blocks = [libc.malloc(n) for n in SIZES]
    for b, n in zip(blocks, SIZES):
        ctypes.memset(b, 1, n)
    for b in reversed(blocks):
        libc.free(b)
def faults(out):
    round_()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        round_()
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
out = []
faults(out)
t = threading.Thread(target=faults, args=(out,))
t.start(); t.join()
print(json.dumps({"applied": applied, "described": described(), "main": out[0], "thread": out[1]}))
"""


def probe(sizes=tuple((8 + 3 * i) << 20 for i in range(6)), **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "PCG_SYNTH_MALLOC" and not k.startswith("MALLOC_")}
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(sizes))], env={**full, **env},
                         capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    return json.loads(run.stdout.strip().splitlines()[-1])


@glibc
def test_freed_rounds_stay_mapped_on_the_main_thread_and_another_thread():
    default = probe(PCG_SYNTH_MALLOC="default")
    tuned = probe()
    # 10 rounds of 93 MiB: glibc's defaults give the pages back and fault them in again
    assert default["applied"] is None and default["described"] == {"left": "PCG_SYNTH_MALLOC=default"}
    assert default["main"] > 20_000 and default["thread"] > 20_000
    assert tuned["applied"] == {name: value for name, (_, value) in malloc.SETTINGS.items()}
    assert tuned["described"] == tuned["applied"]
    assert tuned["main"] < 1_000 and tuned["thread"] < 1_000


@glibc
def test_the_users_own_allocator_settings_are_left_alone():
    mine = probe(MALLOC_TRIM_THRESHOLD_="131072")
    assert mine["applied"] is None and mine["described"] == {"left": "MALLOC_TRIM_THRESHOLD_ is set"}
    assert mine["main"] > 20_000  # what the user's setting does, not ours
    tunables = probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert tunables["described"] == {"left": "GLIBC_TUNABLES sets glibc.malloc"}


@glibc
def test_the_thresholds_without_the_top_pad_leave_a_threads_arena_faulting():
    # why `top_pad` is among the settings: with the two thresholds alone (set through glibc's own
    # variables, so the engine leaves the rest to glibc) the main thread's heap keeps its pages,
    # but a thread's arena deletes each heap that falls empty and faults it in again next round
    sizes = {name: str(value) for name, (_, value) in malloc.SETTINGS.items()}
    alone = probe(MALLOC_MMAP_THRESHOLD_=sizes["mmap_threshold"], MALLOC_TRIM_THRESHOLD_=sizes["trim_threshold"])
    assert alone["applied"] is None
    assert alone["main"] < 1_000
    assert alone["thread"] > 20_000


@glibc
def test_a_block_over_the_largest_mmap_threshold_is_mapped_afresh_unless_mapping_is_off():
    # why `mmap_max` is among the settings: glibc caps the mmap threshold at 32 MiB, so a larger
    # block that finds no room in the heap is mapped, and unmapped when freed, every round. In a
    # round, other blocks take the heap's room; here one block larger than the top pad's 64 MiB
    # finds none: a target's float32 probabilities at batch 64 and gamma 3 ([64, 4, 65537])
    block = [64 * 4 * 65537 * 4]
    sizes = {name: str(value) for name, (_, value) in malloc.SETTINGS.items()}
    thresholds = {"MALLOC_MMAP_THRESHOLD_": sizes["mmap_threshold"], "MALLOC_TRIM_THRESHOLD_": sizes["trim_threshold"],
                  "MALLOC_TOP_PAD_": sizes["top_pad"]}
    mapped = probe(block, **thresholds)
    assert mapped["applied"] is None
    assert mapped["main"] > 80_000  # 10 rounds of its 16,385 pages
    assert probe(block, **thresholds, MALLOC_MMAP_MAX_=sizes["mmap_max"])["main"] < 1_000
    tuned = probe(block)
    assert tuned["applied"]["mmap_max"] == 0 and tuned["main"] < 1_000
    # where it stops: a thread's arena grows in heaps of at most 64 MiB, and glibc maps a larger
    # block for it whatever mmap_max says (engine/models/malloc.py's docstring says so)
    assert tuned["thread"] > 80_000
