"""A fresh local cluster (`address: local`, what `pcg-synth run` starts by default) runs without
Ray's dashboard unless PCG_SYNTH_RAY_DASHBOARD asks for it (engine/connect.py)."""

from __future__ import annotations

import pytest

from engine.connect import init_ray, local_dashboard


@pytest.mark.parametrize(("value", "wanted"), [(None, False), ("", False), ("0", False), ("no", False),
                                               ("1", True), ("true", True), (" On ", True), ("YES", True)])
def test_the_local_dashboard_is_opt_in(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv("PCG_SYNTH_RAY_DASHBOARD", raising=False)
    else:
        monkeypatch.setenv("PCG_SYNTH_RAY_DASHBOARD", value)
    assert local_dashboard() is wanted


@pytest.mark.parametrize("opt_in", [False, True])
def test_a_local_cluster_has_a_dashboard_only_when_asked(monkeypatch, opt_in):
    import ray
    from ray._private.worker import get_dashboard_url

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if opt_in:
        monkeypatch.setenv("PCG_SYNTH_RAY_DASHBOARD", "1")
    else:
        monkeypatch.delenv("PCG_SYNTH_RAY_DASHBOARD", raising=False)
    try:
        assert init_ray(None, num_cpus=1, log_to_driver=False, configure_logging=False) is True
        url = get_dashboard_url()
        assert bool(url) is opt_in, url
        assert init_ray(None) is False  # already initialised: left as it is
    finally:
        ray.shutdown()
