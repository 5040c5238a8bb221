"""pcg-synth: batch speech synthesis with speculative decoding and PCG acceptance.

The public names load on first use, so light modules (`engine.records`, `engine.config`,
`engine.io.*`) import without torch.
"""

from __future__ import annotations

import importlib

__all__ = ["DecodingSettings", "QualityGate", "QualitySpec", "RunSummary", "SynthesisItem", "SynthesisResult",
           "Synthesizer"]
__version__ = "0.1.0"

_HOMES = {
    "DecodingSettings": "engine.config",
    "QualityGate": "engine.metrics.gate",
    "QualitySpec": "engine.config",
    "RunSummary": "engine.records",
    "SynthesisItem": "engine.records",
    "SynthesisResult": "engine.records",
    "Synthesizer": "engine.api",
}


def lazy_names(package: str, homes: dict[str, str]):
    """`__getattr__` and `__dir__` for a package whose public names load on first use: `homes`
    maps each name to the module that defines it."""

    def __getattr__(name: str):
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*vars(importlib.import_module(package)), *homes])

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
