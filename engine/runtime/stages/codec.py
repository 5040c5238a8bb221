"""Codec: attempts' speech codes -> their audio as it will be written (the fourth stage).

With the quality gate on it runs on the verify thread, as rows finish decoding (the gate listens
to the audio); without it, on the IO thread, a window of a shard's rows at a time just before
they are written. Codes of equal length are decoded in one batch. On CUDA the codec runs on a
CUDA stream of its own, so its kernels interleave with the decode loop's instead of queueing
behind them on the default stream.
"""

from __future__ import annotations

import contextlib
import time

from engine.codec.base import Codec
from engine.codec.export import decode_waves, no_codes
from engine.runtime.stages.row import Attempt


class CodecStage:
    """Fills in `Attempt.wave` (or `Attempt.error`, for codes the codec cannot take).

    Args:
        codec: the worker's codec.
        prompt_audio: `output.prompt_audio`: whether a voice prompt's audio is stripped,
            included, or decoded as context and cut (see `codec.prompts.codes_for_audio`).
        device: the worker's device.
    """

    def __init__(self, codec: Codec, prompt_audio: str, device: str) -> None:
        self.codec, self.prompt_audio, self.device = codec, prompt_audio, device
        self._cuda_stream = None

    def stream(self):
        """The codec's own CUDA stream as a context (nothing on a CPU)."""
        import torch

        if not self.device.startswith("cuda"):
            return contextlib.nullcontext()
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=self.device)
        return torch.cuda.stream(self._cuda_stream)

    def __call__(self, attempts: list[Attempt]) -> None:
        """Decode the attempts that have no audio yet; their time is added to their shards'."""
        todo = [a for a in attempts if a.wave is None and a.error is None]
        if not todo:
            return
        start = time.perf_counter()
        for a in todo:
            if not a.codes:  # one decoded again (`Row.retry`) says how many decodes it took
                a.error = no_codes(a.finish_reason) + (f" after {a.retry + 1} attempts" if a.retry else "")
        todo = [a for a in todo if a.error is None]
        modes = {a.row.prompt_audio or self.prompt_audio for a in todo}
        with self.stream():
            for mode in sorted(modes):  # a joined row's later parts take their prompt as context
                mine = [a for a in todo if (a.row.prompt_audio or self.prompt_audio) == mode]
                waves = decode_waves(self.codec, [a.codes for a in mine], [a.row.prompt for a in mine],
                                     mode, [a.row.id for a in mine])
                for a, wave in zip(mine, waves):
                    if isinstance(wave, Exception):
                        a.error = str(wave)
                    else:
                        a.wave = wave
        share = (time.perf_counter() - start) / max(len(todo), 1)
        for a in todo:
            if a.row.task is not None:
                a.row.task.codec_s += share
