"""Groups builder against a brute-force numpy reference, on small random embeddings.

The reference takes the builder's float32 unit rows (`unit_rows`, checked below) and decides
on float64 cosines, which is the builder's definition; it then differs from the builder only
through float64 rounding (~1e-16), which no pair of these data sets comes close to.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.groups.build import EXACT_BAND, build_groups, unit_rows
from engine.groups.csr import GroupIndex, SpeechGroups
from engine.groups.search import make_searcher
from engine.groups.sweep import parse_thetas, sweep

BACKENDS = ["faiss", "torch"]


def random_embeddings(n: int = 2000, d: int = 32, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, d)) * 3.0).astype(np.float32)


def reference_groups(emb: np.ndarray, theta: float, cap: int | None = None) -> tuple[list, int]:
    """Brute force: G(t) = {t} + {t' : cos >= theta}; with a cap, t first, then by cosine
    (descending), ties by id. Returns (sorted member arrays, number of groups cut)."""
    x = unit_rows(emb).astype(np.float64)
    cos = x @ x.T
    groups, cut = [], 0
    for t in range(len(x)):
        others = np.flatnonzero(cos[t] >= theta)
        others = others[others != t]
        if cap is not None and len(others) + 1 > cap:
            cut += 1
            others = others[np.lexsort((others, -cos[t, others]))][:cap - 1]
        groups.append(np.sort(np.concatenate([[t], others])))
    return groups, cut


def assert_groups_equal(groups, expected: list) -> None:
    assert groups.num_groups == len(expected)
    for t, want in enumerate(expected):
        np.testing.assert_array_equal(groups.group(t).astype(np.int64), want, err_msg=f"group {t}")


def test_unit_rows_are_normalised_input_rows():
    emb = random_embeddings(50, 8)
    x = unit_rows(torch.from_numpy(emb).to(torch.float64))
    assert x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(x * np.linalg.norm(emb, axis=1, keepdims=True), emb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("theta,cap", [(0.3, None), (0.45, None), (0.6, None), (1.0, None),
                                       (0.3, 40), (0.45, 4), (0.45, 1)])
def test_matches_brute_force(backend, theta, cap):
    emb = random_embeddings()
    groups = build_groups(emb, theta, cap, backend=backend)
    expected, cut = reference_groups(emb, theta, cap)
    assert_groups_equal(groups, expected)
    assert groups.truncated == cut
    assert groups.members.dtype == np.uint16
    if cap is not None:
        assert cut > 0, "the cap should bite on this data (else the test proves little)"
        assert groups.sizes.max() <= cap


@pytest.mark.parametrize("backend", BACKENDS)
def test_symmetric_and_self_member(backend):
    groups = build_groups(random_embeddings(seed=1), 0.4, backend=backend)
    assert groups.sizes.mean() > 5, "non-trivial groups expected at this theta"
    pairs = {(t, int(m)) for t in range(groups.num_tokens) for m in groups.group(t)}
    assert all((m, t) in pairs for t, m in pairs)
    assert all(t in set(groups.group(t).tolist()) for t in range(groups.num_tokens))
    assert GroupIndex(groups, groups.num_tokens + 1).symmetric


def test_truncation_counted_with_sizes_before_the_cap():
    emb = random_embeddings(seed=2)
    full = build_groups(emb, 0.35)
    capped = build_groups(emb, 0.35, max_group_size=20)
    np.testing.assert_array_equal(capped.full_sizes, full.sizes)
    assert capped.truncated == int((full.sizes > 20).sum()) > 0
    np.testing.assert_array_equal(capped.sizes, np.minimum(full.sizes, 20))
    for t in range(0, 2000, 97):  # the kept members are a subset of the uncapped group
        assert set(capped.group(t).tolist()) <= set(full.group(t).tolist())


def near_threshold_embeddings(cosine: float, n: int = 512, d: int = 64, seed: int = 0) -> np.ndarray:
    """A hub (row 0) whose cosine with every other row lies within 3e-7 of `cosine`: float32
    cosines alone cannot order or threshold these pairs reliably."""
    rng = np.random.default_rng(seed)
    hub = np.eye(d)[0]
    u = rng.standard_normal((n - 1, d))
    u[:, 0] = 0
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    c = cosine + rng.uniform(-3e-7, 3e-7, n - 1)
    rows = np.vstack([hub, c[:, None] * hub + np.sqrt(1 - c[:, None] ** 2) * u])
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]  # off the axes: float32 dots round
    return (rows @ rotation).astype(np.float32)


def test_backends_agree_on_near_ties_at_the_threshold():
    theta = 0.4
    emb = near_threshold_embeddings(theta)
    x = unit_rows(emb)
    exact = x[:1].astype(np.float64) @ x.astype(np.float64).T  # [1, n]
    fooled = []
    for backend in BACKENDS:
        cand = make_searcher(x, backend)(0, 1, theta - EXACT_BAND)
        fooled.append(set(cand.cols[cand.sims >= theta].tolist()) ^ set(np.flatnonzero(exact[0] >= theta)))
    assert any(fooled), "data not adversarial: float32 cosines decided every pair correctly"
    expected, _ = reference_groups(emb, theta)
    for backend in BACKENDS:
        assert_groups_equal(build_groups(emb, theta, backend=backend), expected)


def test_backends_agree_on_near_ties_at_the_cap():
    emb = near_threshold_embeddings(0.5)  # every hub cosine within 3e-7 of 0.5, theta far below
    expected, cut = reference_groups(emb, 0.4, cap=16)
    for backend in BACKENDS:
        groups = build_groups(emb, 0.4, max_group_size=16, backend=backend)
        np.testing.assert_array_equal(groups.group(0), expected[0])
        assert groups.truncated == cut


@pytest.mark.parametrize("theta", [0.0, -0.1, 1.0001, 2, float("nan"), True, "0.4"])
def test_theta_outside_range_is_a_clear_error(theta):
    with pytest.raises(ValueError, match=r"theta must lie in \(0, 1\]"):
        build_groups(random_embeddings(10, 4), theta)


def test_numpy_theta_accepted():
    assert build_groups(random_embeddings(10, 4), np.float32(0.5)).theta == pytest.approx(0.5)


@pytest.mark.parametrize("cap", [0, -3, 2.5])
def test_bad_cap_is_a_clear_error(cap):
    with pytest.raises(ValueError, match="max_group_size must be a positive integer"):
        build_groups(random_embeddings(10, 4), 0.5, cap)


def test_zero_row_and_unknown_backend_are_clear_errors():
    emb = random_embeddings(10, 4)
    emb[3] = 0
    with pytest.raises(ValueError, match="all zeros"):
        build_groups(emb, 0.5)
    with pytest.raises(ValueError, match="backend must be one of"):
        build_groups(random_embeddings(10, 4), 0.5, backend="annoy")


def test_sweep_matches_builds():
    emb = random_embeddings(seed=3)
    rows = sweep(emb, [0.45, 0.3], backend="torch")
    assert [r["theta"] for r in rows] == [0.45, 0.3]
    for row in rows:
        sizes = build_groups(emb, row["theta"]).sizes
        assert row["mean_size"] == pytest.approx(sizes.mean(), abs=1e-4)
        assert row["singletons"] == int((sizes == 1).sum())
        assert row["nnz"] == int(sizes.sum())
    assert rows[0]["coverage"] < rows[1]["coverage"]


def test_parse_thetas():
    assert parse_thetas("0.35, 0.40,0.45") == [0.35, 0.4, 0.45]
    with pytest.raises(ValueError, match="comma-separated"):
        parse_thetas("0.35;0.4")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        parse_thetas("0.4,1.5")


def test_backend_choice_follows_what_the_machine_has():
    from engine.groups.search import choose_backend

    # no GPU (what CPU installs and CI have): faiss-cpu, whichever faiss build is installed
    assert choose_backend("auto", on_gpu=False, faiss_installed=True, faiss_gpus=0) == "faiss-cpu"
    assert choose_backend("faiss", on_gpu=True, faiss_installed=True, faiss_gpus=0) == "faiss-cpu"
    assert choose_backend("auto", on_gpu=True, faiss_installed=True, faiss_gpus=0) == "torch"
    # a faiss GPU build that sees a GPU: faiss-gpu on a CUDA device, faiss-cpu for a CPU device
    assert choose_backend("auto", on_gpu=True, faiss_installed=True, faiss_gpus=1) == "faiss-gpu"
    assert choose_backend("faiss", on_gpu=True, faiss_installed=True, faiss_gpus=2) == "faiss-gpu"
    assert choose_backend("auto", on_gpu=False, faiss_installed=True, faiss_gpus=1) == "faiss-cpu"
    # no faiss at all (neither extra installed): torch, or a clear error when faiss is demanded
    assert choose_backend("auto", on_gpu=False, faiss_installed=False, faiss_gpus=0) == "torch"
    with pytest.raises(ValueError, match=r"pcg-synth\[cpu\]"):
        choose_backend("faiss", on_gpu=False, faiss_installed=False, faiss_gpus=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        choose_backend("annoy", on_gpu=False, faiss_installed=True, faiss_gpus=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_backend_resolution_without_a_gpu():
    from engine.groups.search import faiss_gpu_available, resolve_backend

    assert not faiss_gpu_available()  # no GPU here: no faiss GPU function may be reached
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_backend("auto", cpu) == "faiss-cpu"  # faiss is the faster CPU default
    assert resolve_backend("auto", cuda) == "torch"  # torch on the GPU beats faiss-cpu on the host
    assert resolve_backend("faiss", cuda) == "faiss-cpu"
    assert resolve_backend("torch", cpu) == "torch"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_group_mass_is_its_members_weighted_sum(dtype):
    """`GroupIndex.all_masses` (a sparse product on a CPU, `gathered_masses` elsewhere) against the
    definition, group by group:
    `R_c(G_k) = sum over t in G_k of r(t) / N(t)` (1 / N(t) in float32), on capped groups (asymmetric, so N(t) is not
    |G(t)|) with two non-speech ids beyond the speech tokens (their own singleton groups)."""
    groups = build_groups(random_embeddings(n=500, seed=3), 0.35, max_group_size=12)
    assert groups.truncated > 0
    index = GroupIndex(groups, groups.num_tokens + 2)
    assert not index.symmetric
    probs = torch.softmax(torch.randn(3, groups.num_tokens + 2, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64), -1).to(dtype)
    got = index.all_masses(probs)
    assert got.dtype == dtype and got.shape == (3, index.num_groups) and got.is_contiguous()
    inv_n = index.inv_n.double().numpy()  # 1 / N(t), the engine's float32 equal split
    np.testing.assert_allclose(inv_n, 1.0 / index.n_contain.double().numpy(), rtol=1e-7)
    rows = probs.double().numpy()
    indptr, members = index.indptr.numpy(), index.members.numpy()
    expected = np.stack([[(row[members[a:b]] * inv_n[members[a:b]]).sum() for a, b in zip(indptr[:-1], indptr[1:])]
                         for row in rows])
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=tol, atol=tol * 1e-3)
    # the way other devices take them, the same sums
    np.testing.assert_allclose(index.gathered_masses(probs).double().numpy(), expected, rtol=tol, atol=tol * 1e-3)
    # the coarse masses add up to 1 (to the float32 equal split's rounding)
    np.testing.assert_allclose(got.double().sum(-1).numpy(), 1.0, rtol=1e-6)


# ---- code ranges (Orpheus: one range of ids per frame position) ------------------------------

RANGES = [(0, 700), (700, 500)]  # unequal sizes: a wrong offset cannot line up by chance


def clustered_across_ranges(d: int = 16, seed: int = 4) -> np.ndarray:
    """Both ranges' rows are noisy copies of the same 25 centres: each row's nearest neighbours
    lie in both ranges, so a search that crossed a range would find members there."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((25, d))
    rows = centres[rng.integers(0, 25, sum(size for _, size in RANGES))] + 0.6 * rng.standard_normal((1200, d))
    return rows.astype(np.float32)


def range_of(ids: np.ndarray) -> np.ndarray:
    return np.searchsorted([start for start, _ in RANGES], ids, side="right") - 1


def crossing_groups(groups) -> int:
    return sum(len(set(range_of(groups.group(t).astype(np.int64)))) > 1 for t in range(groups.num_groups))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap", [None, 6])
def test_groups_stay_within_their_code_range(backend, cap):
    """Each range's groups are those of its rows built alone (ids offset); with a cap the nearest
    members are taken within the range, not the nearest overall then filtered."""
    emb = clustered_across_ranges()
    unranged = build_groups(emb, 0.5, cap, backend=backend)
    assert crossing_groups(unranged) > 100, "the data should tempt a search across ranges"
    ranged = build_groups(emb, 0.5, cap, backend=backend, ranges=RANGES)
    assert crossing_groups(ranged) == 0
    assert unranged.mixes_ranges(RANGES) and not ranged.mixes_ranges(RANGES)
    assert not SpeechGroups.singletons(1200).mixes_ranges(RANGES)
    assert ranged.meta["ranges"] == [[0, 700], [700, 500]] and ranged.code_ranges == RANGES
    truncated = 0
    for start, size in RANGES:
        alone = build_groups(emb[start:start + size], 0.5, cap, backend=backend)
        np.testing.assert_array_equal(ranged.indptr[start:start + size + 1] - ranged.indptr[start], alone.indptr)
        np.testing.assert_array_equal(ranged.members[ranged.indptr[start]:ranged.indptr[start + size]],
                                      alone.members.astype(np.int64) + start)
        if cap is not None:
            np.testing.assert_array_equal(ranged.full_sizes[start:start + size], alone.full_sizes)
        assert alone.sizes.mean() > 3, "non-trivial groups expected in each range"
        truncated += alone.truncated
    assert ranged.truncated == truncated
    if cap is None:
        assert GroupIndex(ranged, ranged.num_tokens + 1).symmetric
    else:
        assert ranged.truncated > 0 and ranged.sizes.max() == cap


def test_no_ranges_is_one_range_bit_for_bit():
    emb = clustered_across_ranges()
    for cap in (None, 6):
        plain, one = build_groups(emb, 0.5, cap), build_groups(emb, 0.5, cap, ranges=[(0, 1200)])
        for name in ("indptr", "members", "full_sizes"):
            a, b = getattr(plain, name), getattr(one, name)
            assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), name
        assert plain.truncated == one.truncated and plain.meta == one.meta


@pytest.mark.parametrize("ranges,message", [
    ([], "no range given"),
    ([(0, 700), (700, 400)], "they cover 1100 rows"),
    ([(0, 700), (700, 600)], "they cover 1300 rows"),
    ([(0, 700), (701, 499)], r"range 1 is \(701, 499\), expected to start at 700"),
    ([(700, 500), (0, 700)], r"range 0 is \(700, 500\), expected to start at 0"),
    ([(0, 0), (0, 1200)], r"range 0 is \(0, 0\)"),
    ([(0, 700.0), (700, 500)], "must be integers"),
    ([(0, 700, 1)], r"a \(start, size\) pair"),
])
def test_ranges_that_do_not_tile_the_rows_are_a_clear_error(ranges, message):
    with pytest.raises(ValueError, match=message):
        build_groups(clustered_across_ranges(), 0.5, ranges=ranges)


def test_sweep_within_ranges_matches_ranged_builds():
    emb = clustered_across_ranges()
    (row,) = sweep(emb, [0.5], backend="torch", ranges=RANGES)
    sizes = build_groups(emb, 0.5, ranges=RANGES).sizes
    assert row["nnz"] == int(sizes.sum()) < int(build_groups(emb, 0.5).sizes.sum())
    assert row["singletons"] == int((sizes == 1).sum())
