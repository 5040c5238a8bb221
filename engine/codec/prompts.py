"""Voice prompts: a reference clip (or its precomputed codes) plus its transcript.

A model family's prompter conditions on both (Llasa: the user turn's text is `{prompt
transcript} {new text}` and the assistant turn starts with the clip's X-codec2 codes; Orpheus: a
turn of its own, transcript then SNAC codes); `SynthesisItem.prompt_text` and `.prompt_codes`
carry them to the decoding core. Clips are encoded once: codes are cached under
sha256(codec fingerprint, samples at the codec's rate), in memory and optionally on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from engine.codec.audio import read_clip
from engine.codec.base import Codec, CodecError, as_code_array
from engine.records import SynthesisItem

PromptAudio = Literal["strip", "include", "context"]
PROMPT_AUDIO_MODES: tuple[str, ...] = ("strip", "include", "context")


@dataclass(frozen=True)
class VoicePrompt:
    """A resolved voice prompt: transcript and codec codes (the model family's: X-codec2's, or
    SNAC's in 7-code frames)."""

    id: str
    text: str
    codes: tuple[int, ...]


def prompt_id(text: str, codes: Sequence[int]) -> str:
    """A stable id from the prompt's content: `p-` + 16 hex digits of sha256."""
    digest = hashlib.sha256(text.encode() + b"\0" + np.asarray(codes, dtype="<u4").tobytes())
    return "p-" + digest.hexdigest()[:16]


class PromptCache:
    """Codes of encoded clips, keyed by codec and audio content.

    Args:
        directory: where `{key}.json` files persist across runs; None keeps them in memory only.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, list[int]] = {}

    @staticmethod
    def key(codec: Codec, waveform: np.ndarray) -> str:
        """sha256 of the codec's fingerprint and the float32 samples (at the codec's rate)."""
        digest = hashlib.sha256(codec.fingerprint.encode())
        digest.update(np.ascontiguousarray(waveform, dtype="<f4").tobytes())
        return digest.hexdigest()

    def get(self, key: str) -> list[int] | None:
        if key in self._memory:
            return self._memory[key]
        file = self.directory / f"{key}.json" if self.directory else None
        if file is not None and file.is_file():
            self._memory[key] = json.loads(file.read_text())["codes"]
            return self._memory[key]
        return None

    def put(self, key: str, codes: list[int]) -> None:
        self._memory[key] = codes
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f".{key}.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps({"codes": codes}))
            os.replace(tmp, self.directory / f"{key}.json")  # concurrent writers never tear a file

    def encode(self, codec: Codec, waveform: np.ndarray) -> list[int]:
        """Cached codes of a mono waveform at the codec's rate `[N]`, encoding it on a miss."""
        key = self.key(codec, waveform)
        codes = self.get(key)
        if codes is None:
            codes = codec.encode([waveform])[0]
            self.put(key, codes)
        return codes


def load_voice_prompt(text: str, audio: str | Path | None = None, codes: Sequence[int] | None = None,
                      codec: Codec | None = None, cache: PromptCache | None = None,
                      id: str | None = None) -> VoicePrompt:
    """Resolve a voice prompt from a clip or from precomputed codes.

    Args:
        text: the clip's transcript (Llasa conditions on it).
        audio: a WAV/FLAC clip at any sample rate (resampled to the codec's, mono); needs `codec`.
        codes: precomputed codec codes instead of `audio` (checked against `codec`'s codebook
            when given; the prompter checks them against the model family's when decoding).
        codec: encodes `audio`.
        cache: reuse codes of clips encoded before (a fresh in-memory cache when None).
        id: the prompt's id in the dataset (default: a hash of transcript and codes).

    Raises:
        ValueError: no transcript, neither or both of `audio` and `codes`, `audio` without codec.
        CodecError: unreadable clip, empty or out-of-range codes.
    """
    if not text or not text.strip():
        raise ValueError("a voice prompt needs the transcript of its clip")
    if (audio is None) == (codes is None):
        raise ValueError("give a voice prompt either a clip (audio) or precomputed codes, not both")
    if audio is not None:
        if codec is None:
            raise ValueError(f"encoding the clip {audio} needs a codec")
        codes = (cache or PromptCache()).encode(codec, read_clip(audio, codec.sample_rate))
    checked = as_code_array(codes, codec.codebook_size if codec is not None else None, "voice prompt codes")
    resolved = tuple(int(c) for c in checked)
    return VoicePrompt(id=id or prompt_id(text, resolved), text=text.strip(), codes=resolved)


def with_prompt(items: Sequence[SynthesisItem | str], prompt: VoicePrompt) -> list[SynthesisItem]:
    """Copies of `items` that clone `prompt`'s voice (their own prompts are replaced)."""
    out = []
    for item in items:
        item = SynthesisItem(text=item) if isinstance(item, str) else item
        out.append(replace(item, prompt_text=prompt.text, prompt_codes=list(prompt.codes)))
    return out


def prompts_of(items: Sequence[SynthesisItem | str]) -> list[VoicePrompt | None]:
    """Each item's voice prompt (id from its content), aligned with `items`, for export."""
    out: list[VoicePrompt | None] = []
    for item in items:
        if isinstance(item, str) or not item.prompt_codes:
            out.append(None)
            continue
        text = item.prompt_text or ""
        out.append(VoicePrompt(prompt_id(text, item.prompt_codes), text, tuple(item.prompt_codes)))
    return out


def codes_for_audio(codes: Sequence[int], prompt: VoicePrompt | None, mode: str = "strip"
                    ) -> tuple[list[int], int]:
    """(codes to decode, leading codes whose audio is cut afterwards) for a prompt mode.

    - `strip`: only the generated codes (the core already leaves the prompt out).
    - `include`: prompt + generated codes; the audio starts with the prompt clip.
    - `context`: prompt + generated codes decoded together, then the prompt's audio is cut
      (Llasa's reference recipe: the non-causal decoder sees the prompt as context).
    """
    if mode not in PROMPT_AUDIO_MODES:
        raise ValueError(f"prompt audio mode must be one of {', '.join(PROMPT_AUDIO_MODES)}; got {mode!r}")
    if prompt is None or mode == "strip":
        return list(codes), 0
    joined = list(prompt.codes) + list(codes)
    return joined, (len(prompt.codes) if mode == "context" else 0)


__all__ = ["CodecError", "PromptCache", "VoicePrompt", "codes_for_audio", "load_voice_prompt",
           "prompt_id", "prompts_of", "with_prompt"]
