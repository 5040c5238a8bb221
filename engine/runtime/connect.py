"""Connecting to Ray: an explicit address, else `RAY_ADDRESS`, else a fresh local cluster.

Ray's own default (`ray.init()` with no address) joins whatever cluster `/tmp/ray` last
recorded, including a `ray start` cluster that has since died; it then waits minutes for a GCS
that will never answer. `pcg-synth` promises local Ray unless told otherwise, so it asks for a
fresh local cluster explicitly. Inside a Ray job `RAY_ADDRESS` is set and is used.
"""

from __future__ import annotations

import os

import ray


def init_ray(address: str | None = None, **kwargs) -> bool:
    """Initialise Ray unless already initialised; returns True if this call did.

    Args:
        address: `auto`, `ray://HEAD:10001`, `HOST:PORT` or `local`; None means `RAY_ADDRESS`
            if set, else `local`.
        **kwargs: passed to `ray.init`.
    """
    if ray.is_initialized():
        return False
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", **kwargs)
    return True
