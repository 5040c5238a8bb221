"""Connecting to Ray: an explicit address, else `RAY_ADDRESS`, else a fresh local cluster.

Ray's own default (`ray.init()` with no address) joins whatever cluster `/tmp/ray` last
recorded, including a `ray start` cluster that has since died; it then waits minutes for a GCS
that will never answer. `pcg-synth` promises local Ray unless told otherwise, so it asks for a
fresh local cluster explicitly. Inside a Ray job `RAY_ADDRESS` is set and is used.

A fresh local cluster starts without Ray's dashboard unless `PCG_SYNTH_RAY_DASHBOARD=1` asks for
it (to watch a local job at http://127.0.0.1:8265): the dashboard's head and modules are more
processes that wake up while a job runs, and on a small machine each wake-up takes a core from
one of the OpenMP threads a round decodes on: a job's decode thread is preempted less often
without it. The Jobs API that `pcg-synth submit`
uses lives on a real cluster's head, which `ray start` starts, not here.

An address of a cluster (`HOST:PORT`, `ray://HOST:PORT`, `auto`) is first tried with a plain TCP
connection: where nothing listens, Ray itself would retry for many minutes or end in a
traceback (`ray://`).
"""

from __future__ import annotations

import os
import signal
import socket

import ray

from engine.errors import TERMINATED, ClusterUnreachable, Terminated, raise_terminated

PROBE_TIMEOUT_S = 10.0


def init_ray(address: str | None = None, **kwargs) -> bool:
    """Initialise Ray unless already initialised; returns True if this call did.

    Args:
        address: `auto`, `ray://HEAD:10001`, `HOST:PORT` or `local`; None means `RAY_ADDRESS`
            if set, else `local`.
        **kwargs: passed to `ray.init` (a local cluster's `include_dashboard` defaults to
            `local_dashboard()`).

    Raises:
        ClusterUnreachable: the cluster's port does not accept a connection, or Ray's client
            gave up connecting.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    target = endpoint(address)
    if target is not None:
        why = refused(*target)
        if why is not None:
            raise ClusterUnreachable(unreachable(address, target, why))
    if address == "local":
        kwargs.setdefault("include_dashboard", local_dashboard())
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as exc:  # e.g. Ray's client timing out on a ray:// address
        raise ClusterUnreachable(unreachable(address, target, str(exc).splitlines()[0])) from None
    except SystemExit as exc:  # SIGTERM while Ray's init had its own handler (`sys.exit(15)`) in place
        if sigterm is raise_terminated and exc.code == signal.SIGTERM:
            TERMINATED.set()
            raise Terminated() from None
        raise
    finally:
        if sigterm is raise_terminated:  # the CLI's: Ray's init replaces it with an abort
            signal.signal(signal.SIGTERM, sigterm)
    return True


def local_dashboard() -> bool:
    """Whether a fresh local cluster starts Ray's dashboard: only where `PCG_SYNTH_RAY_DASHBOARD`
    says so (1, true, yes, on; module docstring)."""
    return os.environ.get("PCG_SYNTH_RAY_DASHBOARD", "").strip().lower() in ("1", "true", "yes", "on")


def endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) that connecting to `address` opens first: the Ray client server for
    `ray://`, the GCS for `HOST:PORT` and for `auto` (`RAY_ADDRESS`, else the cluster `ray start`
    recorded last); None for a local cluster, or where it cannot be told."""
    if address == "local":
        return None
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or recorded_address() or ""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "ray"):
        return None
    host, _, port = rest.split("/")[0].rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def recorded_address() -> str | None:
    """The address of the cluster `ray start` last started on this machine, if any."""
    try:
        from ray._private.utils import read_ray_address
    except ImportError:  # pragma: no cover - a Ray without it: Ray's own lookup decides
        return None
    return read_ray_address()


def refused(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if a TCP connection to host:port opens within `timeout_s`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


def unreachable(address: str, target: tuple[str, int] | None, why: str) -> str:
    where = f" ({target[0]}:{target[1]})" if target and address == "auto" else ""
    return (f"cannot reach the Ray cluster at {address}{where}: {why}. Is it up? `ray start --head` "
            "prints its address (HOST:6379 on its nodes); from elsewhere use ray://HEAD:10001, "
            "or leave --address out for a local cluster")
