"""The C allocator for CPU decoding: memory a decode round frees stays with the process.

A decode round on a CPU allocates and frees tens of megabytes of vocabulary-wide temporaries
(logits, probabilities, sorts and cumulative sums over 66k tokens for every row and position).
glibc's malloc, left to its defaults, hands much of that back to the kernel after each round:
blocks above its mmap threshold are unmapped on free, the top of a heap above its trim threshold
is trimmed, and a thread's arena deletes a heap that falls empty. The next round then touches
fresh pages again, each a minor page fault in which the kernel zeroes 4 KiB, and on 2 cores a
fault in either OpenMP thread stalls the other at the op's barrier.

Keeping that memory removes nearly all of those faults and speeds up decoding alone and jobs.

Blocks above glibc's largest mmap threshold (32 MiB) come from the heap too (`mmap_max` 0): a
target's probabilities at batch 32 and gamma 3 are such a block, and mapped afresh each round they
would be faulted in page by page every round. Where a
heap cannot grow, glibc still maps memory as its fallback, so a request never fails for this; and
a thread's arena grows in heaps of at most 64 MiB, so on a thread of its own (a job worker's decode
loop) a block above 64 MiB (the target's probabilities from batch 64 at gamma 3) is still mapped
afresh each time.

The two thresholds go together: setting either turns off glibc's own adjustment of both (it
raises them as large blocks are freed), and either one set alone makes a job fault more than
glibc's defaults. The
top pad is for a thread's arena: with the thresholds alone, a thread of its own still faults on
every round's large blocks (tests/cpu/test_malloc.py pins both).

Where glibc is not the C library, or the user has set the allocator's environment variables
(`MALLOC_*_`, `GLIBC_TUNABLES`), or `PCG_SYNTH_MALLOC=default`, nothing is changed. What is kept
is about the process's peak, a round's temporaries coming back every round anyway; a heap holds
what its holes cannot place as well (a few per cent more peak resident memory than with blocks
over 32 MiB mapped).
"""

from __future__ import annotations

import os

# mallopt(3) parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4

SETTINGS = {
    # glibc's own ceiling for its adjusted threshold on 64-bit: blocks up to it come from the heap
    "mmap_threshold": (M_MMAP_THRESHOLD, 32 << 20),
    # free memory at the top of a heap up to this stays mapped
    "trim_threshold": (M_TRIM_THRESHOLD, 1 << 30),
    # what a heap grows by beyond a request, and keeps when it shrinks: a thread's arena (the
    # decode thread's) keeps its heaps instead of deleting each one that falls empty
    "top_pad": (M_TOP_PAD, 64 << 20),
    # no block from mmap at all: glibc caps the threshold above at 32 MiB, and a round's largest
    # temporaries pass it (a target's float32 probabilities at batch 32 and gamma 3, [32, 4, 65537],
    # are 1 KiB over), so without this each was mapped and faulted in afresh every round
    "mmap_max": (M_MMAP_MAX, 0),
}

USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_applied: dict | None = None
_tried = False


def why_not() -> str | None:
    """Why the process's allocator is left as it is (None: it is tuned here)."""
    if os.environ.get("PCG_SYNTH_MALLOC", "").strip().lower() == "default":
        return "PCG_SYNTH_MALLOC=default"
    for name in USER_VARIABLES:
        if name in os.environ:
            return f"{name} is set"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    return None if is_glibc() else "the C library is not glibc"


def is_glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError, AttributeError):  # no such name: not glibc
        return False


def keep_freed_memory() -> dict | None:
    """Apply `SETTINGS` to this process's glibc malloc, once; returns what was applied (name ->
    bytes), or None where it was left alone (`why_not`). Idempotent, and safe at any time: it
    changes only what later allocations and frees do."""
    global _applied, _tried
    if _tried:
        return _applied
    _tried = True
    if why_not() is not None:
        return None
    applied = {name: value for name, (param, value) in SETTINGS.items() if mallopt(param, value)}
    _applied = applied or None
    return _applied


def mallopt(param: int, value: int) -> bool:
    """glibc's mallopt(3) on this process: whether it took the setting (False where there is no
    such function)."""
    import ctypes

    try:
        call = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    call.argtypes, call.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return call(param, value) == 1


def described() -> dict:
    """What this process's allocator runs with, for records: the settings applied here (bytes),
    or `{"left": why}`."""
    return dict(_applied) if _applied else {"left": why_not() or "not tuned in this process"}
