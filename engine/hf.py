"""transformers' classes by name, safe on any thread.

transformers' package replaces itself in `sys.modules` with a lazy module at the end of its first
import. A `from transformers import X` statement on a thread that meets that import running on
another thread waits for it, then reads `X` off the package object it found before, which never
gets the lazy names: `ImportError: cannot import name 'TokenizersBackend' from 'transformers'`,
in every try of a fresh process loading a `Synthesizer` on one thread and an X-codec2 codec on
another (`tests/cpu/test_threaded_loading.py`). `importlib.import_module` looks the module up in
`sys.modules` again once the import is done, so the engine imports transformers only through
`from_transformers` (the linter refuses `import transformers` statements in `engine/`).
"""

from __future__ import annotations

import importlib


def from_transformers(name: str, module: str = "transformers"):
    """What `from {module} import {name}` means, without that statement's race (above)."""
    return getattr(importlib.import_module(module), name)
