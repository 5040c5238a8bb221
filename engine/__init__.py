"""pcg-synth: batch speech synthesis with speculative decoding and PCG acceptance.

The public names load on first use, so light modules (`engine.records`, `engine.config`,
`engine.io.*`) import without torch.
"""

from __future__ import annotations

import importlib

__all__ = ["DecodingSettings", "RunSummary", "SynthesisItem", "SynthesisResult", "Synthesizer"]
__version__ = "0.1.0"

_HOMES = {
    "DecodingSettings": "engine.config",
    "RunSummary": "engine.records",
    "SynthesisItem": "engine.records",
    "SynthesisResult": "engine.records",
    "Synthesizer": "engine.api",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
