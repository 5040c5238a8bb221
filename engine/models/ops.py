"""The engine's own torch ops (namespace `pcg_synth`): Python functions a compiled round calls as
they are, opaque to the graph (`opaque_op`).

They are defined through `torch.library.Library` rather than `torch.library.custom_op`, whose
Python autograd wrapper runs on every call of a compiled round (rounds run under `no_grad`, not
inference mode, since a graph that writes the caches cannot run in inference mode).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIBRARY = torch.library.Library("pcg_synth", "DEF")  # kept alive: its ops live as long as it does


def opaque_op(name: str, schema: str, impl: Callable, shape: Callable):
    """Define `torch.ops.pcg_synth.<name>` with the argument list `schema` (e.g.
    `"(Tensor x) -> Tensor"`), running `impl` on real tensors and `shape` (the same arguments,
    returning an empty tensor of the output's shape and dtype) while a graph is traced. Returns
    the op."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"pcg_synth::{name}", shape, lib=_LIBRARY)
    return getattr(torch.ops.pcg_synth, name)
