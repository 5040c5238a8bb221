"""What a synthesis worker does, without Ray: hold the models once, turn shards into files.

A shard becomes one Parquet file (every manifest row exactly once: audio rows and error rows)
and then a commit record. The commit record is written last, so a shard counts as done only
when its data file is complete; a worker that dies in between leaves an uncommitted shard that
is redone (and its data file overwritten with identical content).
"""

from __future__ import annotations

import io
import json
import os
import socket
import time
from dataclasses import dataclass
from functools import lru_cache

from pydantic import ValidationError

from engine.api import Synthesizer
from engine.config import DecodingSettings, JobSpec
from engine.groups.csr import SpeechGroups
from engine.io.manifest import ManifestRow, RowError, parse_jsonl, parse_rows, validated
from engine.io.storage import Storage, StorageError, relative_to
from engine.models.device import resolve_device
from engine.records import SynthesisItem, SynthesisResult, aggregate, item_seed
from engine.runtime.plan import Layout, Shard


@dataclass
class Prepared:
    """One manifest row ready to decode (`item`), or already failed (`error`)."""

    item: SynthesisItem | None
    settings: DecodingSettings
    prompt: object | None  # VoicePrompt
    error: SynthesisResult | None
    origin: dict


class ShardProcessor:
    """Models, codec and groups of one worker, and the shard -> Parquet + commit pipeline.

    Args:
        spec: the job.
        groups: PCG groups prepared by the driver (None unless the method is `pcg`).
        worker_id: a label for the summary's per-worker figures.
    """

    def __init__(self, spec: JobSpec, groups: SpeechGroups | None = None, worker_id: str = "w0") -> None:
        from engine.codec.prompts import PromptCache
        from engine.codec.xcodec2 import Xcodec2Codec

        self.spec, self.worker_id = spec, worker_id
        self.storage = Storage(spec.storage)
        self.layout = Layout(spec.output.uri)
        self.device = str(resolve_device(spec.resources.device))
        local = self.storage.local_dir
        draft = local(spec.models.draft) if spec.models.draft else None
        self.synth = Synthesizer.load(local(spec.models.target), draft=draft, device=self.device,
                                      dtype=spec.models.dtype, batch_size=spec.resources.batch_size)
        if groups is not None:
            self.synth.set_groups(groups)
        self.codec = Xcodec2Codec.load(local(spec.models.codec), device=self.device)
        from engine.models.loading import checkpoint_revision

        dirs = {"target": local(spec.models.target), "draft": draft, "codec": local(spec.models.codec)}
        self.revisions = {k: checkpoint_revision(v) for k, v in dirs.items() if v is not None}
        self.prompt_cache = PromptCache()
        self._read_whole = lru_cache(maxsize=2)(self._parse_file)

    def warmup(self) -> None:
        """Decode and encode a little with the job's settings, so allocation, kernel selection
        and the decoder's caches are paid for before anything is timed."""
        items = [SynthesisItem(text="Warm-up sentence number one.", id="w0"), SynthesisItem(text="And two.", id="w1")]
        results, _ = self.synth.synthesize(items, self.spec.decoding.model_copy(update={"max_new_tokens": 16}))
        self.codec.decode([r.codes for r in results if r.codes])

    def info(self) -> dict:
        import ray

        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"worker": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "node": node, "gpu_ids": [str(g) for g in gpus], "device": self.device}

    # ---- reading ---------------------------------------------------------------------------

    def _parse_file(self, uri: str) -> list:
        return parse_rows(uri, self.storage.read_bytes(uri))

    def rows_of(self, shard: Shard) -> list[ManifestRow | RowError]:
        """The shard's rows in manifest order; duplicates (found by the plan) become errors."""
        if shard.byte_range is not None:
            raws = parse_jsonl(self.storage.read_range(shard.manifest, *shard.byte_range))
        else:
            raws = self._read_whole(shard.manifest)[shard.start:shard.stop]
        if len(raws) != shard.rows:
            raise RuntimeError(f"{shard.manifest} changed since the job was planned "
                               f"({len(raws)} rows where {shard.rows} were planned)")
        rows = validated(raws, shard.manifest, shard.start)
        for i, first in shard.duplicates.items():
            row = rows[i - shard.start]
            if isinstance(row, ManifestRow):
                rows[i - shard.start] = RowError(f"{shard.manifest}:{i + 1}", row.id,
                                                 f"duplicate id (first at {first})", row.text)
        return rows

    def voice_prompt(self, shard: Shard, row: ManifestRow):
        """The row's voice prompt (None without one); clips are read through storage, encoded
        once and cached by content."""
        from engine.codec.audio import read_clip
        from engine.codec.prompts import load_voice_prompt

        if row.prompt_codes is None and row.prompt_audio is None:
            return None
        if row.prompt_codes is not None:
            return load_voice_prompt(row.prompt_text or "", codes=row.prompt_codes, id=row.prompt_id)
        clip = relative_to(shard.manifest, row.prompt_audio)
        wave = read_clip(io.BytesIO(self.storage.read_bytes(clip)))
        codes = self.prompt_cache.encode(self.codec, wave)
        return load_voice_prompt(row.prompt_text or "", codes=codes, id=row.prompt_id)

    # ---- processing ------------------------------------------------------------------------

    def origin(self, row: ManifestRow | RowError) -> dict:
        """Provenance of a row: where it came from and which models made it."""
        out = {"models": self.revisions}
        if isinstance(row, ManifestRow):
            out.update({k: v for k, v in (("text_id", row.text_id), ("prompt_id", row.prompt_id),
                                          ("augment_seed", row.augment_seed)) if v is not None})
        return out

    def prepare(self, shard: Shard) -> list[Prepared]:
        """The shard's rows, each ready to decode or already an error result."""
        base = self.spec.decoding
        out = []
        for row in self.rows_of(shard):
            if isinstance(row, RowError):
                ident = row.id or f"!{row.source}"
                out.append(Prepared(None, base, None, SynthesisResult(
                    id=ident, text=row.text, seed=item_seed(base.seed, ident), error=row.error),
                    self.origin(row)))
                continue
            try:
                settings = DecodingSettings(**{**base.model_dump(), **row.overrides()})
                prompt = self.voice_prompt(shard, row)
            except (ValidationError, ValueError, StorageError) as exc:
                out.append(Prepared(None, base, None, SynthesisResult(
                    id=row.id, text=row.text, seed=item_seed(base.seed, row.id), error=str(exc)),
                    self.origin(row)))
                continue
            item = SynthesisItem(text=row.text, id=row.id, seed=row.seed,
                                 prompt_text=prompt.text if prompt else None,
                                 prompt_codes=list(prompt.codes) if prompt else None)
            out.append(Prepared(item, settings, prompt, None, self.origin(row)))
        return out

    def decode(self, prepared: list[Prepared]) -> tuple[list[SynthesisResult], dict]:
        """Decode the good rows, one batch run per distinct settings (per-row overrides).
        Returns the results and the batch's slot occupancy (decode rounds, busy slot-rounds)."""
        results = [p.error for p in prepared]
        occupancy = {"decode_rounds": 0, "slot_rounds": 0, "gamma_choices": []}
        by_settings: dict[str, list[int]] = {}
        for i, p in enumerate(prepared):
            if p.item is not None:
                by_settings.setdefault(p.settings.model_dump_json(), []).append(i)
        for indices in by_settings.values():
            settings = prepared[indices[0]].settings
            done, summary = self.synth.synthesize([prepared[i].item for i in indices], settings)
            occupancy["decode_rounds"] += summary.decode_rounds
            occupancy["slot_rounds"] += summary.slot_rounds
            if summary.gamma_choice:
                occupancy["gamma_choices"].append(summary.gamma_choice)
            for i, res in zip(indices, done):
                results[i] = res
        return results, occupancy

    def process(self, shard: Shard, attempt: int = 1) -> dict:
        """Synthesize one shard, write its Parquet file, then its commit record."""
        from engine.codec.export import export_audio

        start = time.perf_counter()
        prepared = self.prepare(shard)
        results, occupancy = self.decode(prepared)
        decode_s = time.perf_counter() - start
        buffer = io.BytesIO()
        exported = export_audio(results, [p.settings for p in prepared], None, parquet_path=buffer,
                                codec=self.codec, audio_format=self.spec.output.audio_format,
                                prompts=[p.prompt for p in prepared],
                                prompt_audio=self.spec.output.prompt_audio,
                                provenance=[p.origin for p in prepared])
        self.storage.write_bytes(self.layout.data(shard), buffer.getvalue())
        stats = aggregate([r.stats for r in results if r.stats is not None])
        record = {
            "shard": shard.id, "manifest": shard.manifest, "rows": shard.rows,
            "ok": exported["with_audio"], "failed": shard.rows - exported["with_audio"],
            "audio_seconds": exported["audio_seconds"], "generated_tokens": stats.generated_tokens,
            "rounds": stats.rounds, "emitted": stats.emitted, "reached": stats.reached,
            "accepted": stats.accepted, "thinning_trials": stats.thinning_trials,
            "decode_s": round(decode_s, 4), "codec_s": exported["codec_seconds"],
            "wall_s": round(time.perf_counter() - start, 4), "attempt": attempt,
            "batch_size": self.spec.resources.batch_size, **occupancy,
            "data": self.layout.data(shard), **self.info(),
        }
        self.storage.write_bytes(self.layout.commit(shard), json.dumps(record, indent=1).encode())
        return record
