"""DNSMOS P.835 (signal, background, overall) and P.808 MOS through `speechmos` (optional)."""

from __future__ import annotations

import numpy as np

from engine.metrics.deps import require


class DNSMOS:
    """Microsoft's DNSMOS ONNX models as shipped in the `speechmos` wheel (CPU onnxruntime)."""

    name = "DNSMOS (speechmos)"

    def __init__(self) -> None:
        for module, package in (("onnxruntime", "onnxruntime"), ("librosa", "librosa")):
            require(module, package, "dnsmos", "DNSMOS")
        self.module = require("speechmos.dnsmos", "speechmos", "dnsmos", "DNSMOS")

    def score(self, wave: np.ndarray) -> dict[str, float]:
        """{dnsmos_ovrl, dnsmos_sig, dnsmos_bak, dnsmos_p808} of a 16 kHz clip."""
        wave = np.clip(np.asarray(wave, dtype=np.float32), -1.0, 1.0)
        out = self.module.run(wave, sr=16_000)
        return {f"dnsmos_{k.removesuffix('_mos')}": float(v) for k, v in out.items()
                if k.endswith("_mos")}
