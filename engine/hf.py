"""transformers' classes, imported one thread at a time.

transformers is a lazy package: while one thread imports a part of it for the first time, another
thread's `from transformers import X` can find the package half-built and fail
(`ImportError: cannot import name 'TokenizersBackend' from 'transformers'`, seen in a fresh
process loading a `Synthesizer` on one thread and an X-codec2 codec on another, in every try).
Every import of transformers in the engine goes through `from_transformers`, under one lock, so
loads on several threads of a service or a worker take turns for those imports and nothing else.
"""

from __future__ import annotations

import importlib
import threading

_LOCK = threading.RLock()


def from_transformers(name: str, module: str = "transformers"):
    """`from {module} import {name}` under the process-wide lock."""
    with _LOCK:
        return getattr(importlib.import_module(module), name)
