"""Distributed groups build on a real local Ray cluster (2 CPUs): equal to the local build, and a
slice whose worker process dies is retried on a fresh worker."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.groups.build import build_groups
from engine.groups.distributed import SliceWorker, build_groups_distributed
from engine.groups.options import GroupsBuild


@pytest.fixture(scope="module")
def emb() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1500, 24)).astype(np.float32)


def assert_same(a, b) -> None:
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.members, b.members)
    assert a.members.dtype == b.members.dtype
    assert (a.truncated, a.max_group_size) == (b.truncated, b.max_group_size)
    if a.full_sizes is not None or b.full_sizes is not None:
        np.testing.assert_array_equal(a.full_sizes, b.full_sizes)


@pytest.mark.parametrize("cap", [None, 12])
def test_two_workers_equal_local_build(local_ray, emb, cap):
    local = build_groups(emb, 0.35, cap)
    spread = build_groups_distributed(emb, GroupsBuild(0.35, cap, workers=2), slice_rows=256)
    assert_same(spread, local)
    assert spread.meta["workers"] == 2 and spread.meta["retries"] == 0
    assert local.sizes.mean() > 3 and (cap is None or local.truncated > 0)


@pytest.mark.parametrize("cap", [None, 12])
def test_two_workers_equal_local_build_within_code_ranges(local_ray, emb, cap):
    """Slices of 256 rows would cross the end of the first range (700) if they were not cut there."""
    ranges = [(0, 700), (700, 800)]
    local = build_groups(emb, 0.35, cap, ranges=ranges)
    spread = build_groups_distributed(emb, GroupsBuild(0.35, cap, ranges=ranges, workers=2), slice_rows=256)
    assert_same(spread, local)
    assert spread.meta["ranges"] == [[0, 700], [700, 800]]
    def second_range(groups, t: int) -> set:
        return set((groups.group(t).astype(np.int64) >= 700).tolist())

    assert all(second_range(local, t) == {t >= 700} for t in range(1500))
    unranged = build_groups(emb, 0.35, cap)
    assert any(second_range(unranged, t) == {False, True} for t in range(1500)), "ranges should matter here"


def test_dead_worker_slice_is_retried(local_ray, emb, tmp_path):
    marker = str(tmp_path / "crash-once")
    open(marker, "w").close()

    class CrashOnce(SliceWorker):
        """Kills its own process the first time it is handed the slice starting at 512."""

        def search(self, lo, hi, theta, max_group_size):
            if lo == 512 and os.path.exists(marker):
                os.remove(marker)
                os._exit(1)
            return super().search(lo, hi, theta, max_group_size)

    groups = build_groups_distributed(emb, GroupsBuild(0.35, workers=2), slice_rows=256, worker_cls=CrashOnce)
    assert not os.path.exists(marker), "the crash never happened"
    assert groups.meta["retries"] == 1
    assert_same(groups, build_groups(emb, 0.35))


def test_slice_that_always_kills_its_worker_gives_up(local_ray, emb):
    class AlwaysCrash(SliceWorker):
        def search(self, lo, hi, theta, max_group_size):
            if lo == 0:
                os._exit(1)
            return super().search(lo, hi, theta, max_group_size)

    with pytest.raises(RuntimeError, match=r"groups slice 0\.\.750 failed 2 times"):
        build_groups_distributed(emb, GroupsBuild(0.35, workers=2), slice_rows=750, max_attempts=2,
                                 worker_cls=AlwaysCrash)


def test_errors_before_any_worker_starts(local_ray, emb):
    with pytest.raises(ValueError, match=r"theta must lie in \(0, 1\]"):
        build_groups_distributed(emb, GroupsBuild(0.0, workers=2))
    with pytest.raises(ValueError, match="code ranges must tile 0..1499"):
        build_groups_distributed(emb, GroupsBuild(0.35, ranges=[(0, 700), (700, 700)], workers=2))
