"""A small cross-sentence voice-cloning manifest with synthetic prompt clips, for proving
`pcg-synth paper-table` end to end on the tiny kit (its numbers mean nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import soundfile as sf

from engine.metrics.signals import synthetic_voice

VOICES = [  # (seed, f0, formants): two "speakers"
    (11, 110.0, (700.0, 1200.0, 2600.0)),
    (12, 210.0, (850.0, 1600.0, 2900.0)),
]
PROMPT_TEXT = "This is my voice."
TEXTS = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
]


def write_demo_manifest(out_dir: str | Path, rows: int = 6) -> Path:
    """Write `prompts/voice{k}.wav` and `manifest.jsonl` (`rows` rows, voices alternating)."""
    out = Path(out_dir)
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    for k, (seed, f0, formants) in enumerate(VOICES):
        sf.write(out / "prompts" / f"voice{k}.wav", synthetic_voice(seed, 2.0, f0, formants), 16_000)
    lines = [json.dumps({"id": f"demo-{i}", "text": TEXTS[i % len(TEXTS)], "prompt_text": PROMPT_TEXT,
                         "prompt_audio": f"prompts/voice{i % len(VOICES)}.wav"})
             for i in range(rows)]
    path = out / "manifest.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
