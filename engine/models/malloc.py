"""The C allocator for CPU decoding: memory a decode round frees stays with the process.

A decode round on a CPU allocates and frees large vocabulary-wide temporaries (logits,
probabilities, sorts and cumulative sums for every row and position). glibc's malloc, left to its
defaults, hands much of that back to the kernel after each round (large blocks are unmapped on
free, a heap's top is trimmed, a thread's arena deletes a heap that falls empty), so the next round
faults fresh zeroed pages in again, and a fault in one OpenMP thread stalls the others at the op's
barrier. `keep_freed_memory` sets glibc's thresholds (`SETTINGS`) so that memory is kept:

- the mmap and trim thresholds go together: setting either turns off glibc's own adjustment of
  both, so either alone faults more than the defaults;
- the top pad keeps a thread's arena (a job worker's decode loop) from deleting its heaps;
- `mmap_max` 0 puts blocks above glibc's largest mmap threshold on the heap too. Where a heap
  cannot grow glibc still maps, so no request fails for this; a thread's arena grows in heaps of
  at most 64 MiB, so larger blocks there are still mapped each time.

What is kept is about the process's peak (a round's temporaries come back every round anyway),
plus what a heap's holes cannot place. Nothing is changed where glibc is not the C library, where
the user set the allocator's environment variables (`MALLOC_*_`, `GLIBC_TUNABLES`), or under
`PCG_SYNTH_MALLOC=default`.
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
    # are 1 KiB over), so without this each would be mapped and faulted in afresh every round
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
