"""Prepare: manifest rows -> row records ready to decode (the second stage a row passes).

A row gets its decoding settings (the job's with the row's own applied), its seed, its voice
prompt (a clip is read through storage and encoded once, cached by content) and its provenance;
then its text is normalised and planned (`engine.text.prepare.TextPlanner`: `text.normalize`,
`text.split`). A text cut into chunks gets one part per chunk (`Row.parts`): the chunk's text,
the row's settings and voice prompt, a seed derived from the row's (`chunk_seeds`), the id
`<row id>#<index>` and `text.chunk_retries` (decodes again of an attempt that ends without a
speech code); the parts are decoded as rows of the batch, beside other rows. A row that
cannot be decoded (a malformed manifest row, a duplicate id, invalid settings, a voice-prompt
clip that cannot be read, a text the normaliser fails on) becomes a row whose result carries
the error: it is written as an error record and never reaches the decoder.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from pydantic import ValidationError

from engine.config import DecodingSettings
from engine.io.manifest import ManifestRow, RowError
from engine.io.storage import Storage, StorageError, relative_to
from engine.records import SynthesisResult, item_seed
from engine.runtime.stages.row import Row
from engine.text.chunks import TextPlan, chunk_id, chunk_seeds
from engine.text.prepare import TextPlanner


class PrepareStage:
    """Row records from a shard's manifest rows.

    Args:
        decoding: the job's decoding settings.
        storage: reads voice-prompt clips.
        revisions: the models' revisions (every row's provenance).
        encode_clip: a clip at `sample_rate` -> its codec codes (the worker encodes on its IO thread).
        sample_rate: the codec's.
        keep_clips: keep each clip's audio with its row (the quality gate's speaker check).
        planner: normalises and plans texts (None: texts are decoded as they are).
        joined_include: a split row's parts are joined and its audio includes the voice prompt's
            (`output.prompt_audio: include`): only the first part's audio starts with it.
    """

    def __init__(self, decoding: DecodingSettings, storage: Storage, revisions: dict,
                 encode_clip: Callable[[np.ndarray], list[int]], sample_rate: int, keep_clips: bool = False,
                 planner: TextPlanner | None = None, joined_include: bool = False) -> None:
        self.decoding, self.storage, self.revisions = decoding, storage, revisions
        self.sample_rate = sample_rate
        self.encode_clip, self.keep_clips = encode_clip, keep_clips
        self.planner, self.joined_include = planner, joined_include

    def origin(self, row: ManifestRow | RowError) -> dict:
        """Provenance of a row: where it came from and which models made it."""
        out = {"models": self.revisions}
        if isinstance(row, ManifestRow):
            out.update({k: v for k, v in (("text_id", row.text_id), ("prompt_id", row.prompt_id),
                                          ("voice", row.voice), ("augment_seed", row.augment_seed))
                        if v is not None})
        return out

    def voice_prompt(self, manifest: str, row: ManifestRow):
        """(the row's voice prompt or None, its clip's audio at the codec's rate or None); a clip path is
        taken relative to the manifest, read through storage and encoded once (cached by
        content)."""
        from engine.codec.audio import read_clip
        from engine.codec.prompts import load_voice_prompt

        if row.prompt_codes is not None:
            return load_voice_prompt(row.prompt_text or "", codes=row.prompt_codes, id=row.prompt_id), None
        if row.prompt_audio is None:
            return None, None
        clip = relative_to(manifest, row.prompt_audio)
        wave = read_clip(io.BytesIO(self.storage.read_bytes(clip)), self.sample_rate, name=clip)
        prompt = load_voice_prompt(row.prompt_text or "", codes=self.encode_clip(wave), id=row.prompt_id)
        return prompt, wave

    def plan(self, row: Row) -> None:
        """Normalise and plan the row's text; a text cut into chunks gets its parts.

        Raises:
            ValueError: the normaliser failed on the text.
        """
        if self.planner is None:
            return
        prompt = row.prompt
        prepared = self.planner(row.text, row.settings.max_new_tokens, prompt.text if prompt else None,
                                list(prompt.codes) if prompt else None, row.voice)
        row.normalized, row.plan = prepared.normalized, prepared.plan
        if prepared.split:
            row.parts = self.parts(row, prepared.plan)

    def parts(self, row: Row, plan: TextPlan) -> list[Row]:
        """A row's chunks as rows of their own (`Row.parts`)."""
        out = []
        for i, (chunk, seed) in enumerate(zip(plan.chunks, chunk_seeds(row.seed, len(plan.chunks)))):
            where = {"index": i, "start": chunk.start, "end": chunk.end, "boundary": chunk.boundary}
            out.append(Row(row.index, SynthesisResult(id=chunk_id(row.id, i), text=chunk.text, seed=seed),
                           row.settings, {**row.origin, "chunk": where}, prompt=row.prompt, voice=row.voice,
                           prompt_wave=row.prompt_wave, seed=seed, parent=row, segment=i,
                           prompt_audio="context" if self.joined_include and i > 0 else None,
                           chunk_retries=self.planner.spec.chunk_retries))
        return out

    def error_row(self, index: int, ident: str, text: str, why: str, origin: dict) -> Row:
        seed = item_seed(self.decoding.seed, ident)
        return Row(index, SynthesisResult(id=ident, text=text, seed=seed, error=why), self.decoding, origin,
                   seed=seed)

    def __call__(self, manifest: str, rows: list[ManifestRow | RowError]) -> list[Row]:
        """One record per manifest row, in order: ready to decode, or an error row."""
        out = []
        for index, row in enumerate(rows):
            origin = self.origin(row)
            if isinstance(row, RowError):
                out.append(self.error_row(index, row.id or f"!{row.source}", row.text, row.error, origin))
                continue
            try:
                settings = self.decoding.with_overrides(row.overrides())
                prompt, clip = self.voice_prompt(manifest, row)
            except (ValidationError, ValueError, StorageError) as exc:
                out.append(self.error_row(index, row.id, row.text, str(exc), origin))
                continue
            seed = row.seed if row.seed is not None else item_seed(self.decoding.seed, row.id)
            prepared = Row(index, SynthesisResult(id=row.id, text=row.text, seed=seed), settings, origin,
                           prompt=prompt, voice=row.voice, prompt_wave=clip if self.keep_clips else None, seed=seed)
            try:
                self.plan(prepared)
            except ValueError as exc:
                out.append(self.error_row(index, row.id, row.text, f"text: {exc}", origin))
                continue
            out.append(prepared)
        return out
