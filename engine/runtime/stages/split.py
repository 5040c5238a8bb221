"""A split row in the write stage: its parts put back together into one row
(`text.split_output: joined`), and what a shard's commit record says of its split rows.

The joined row's codes are its parts' codes in order, its statistics their sum, its quality
verdict theirs combined (`engine.text.join`); its audio is the parts' audio joined (edge
silence trimmed, a short crossfade), and its provenance keeps a record per part (`chunks`:
text, where it lies in the row's text, the boundary it was cut at, seed, codes, finish reason,
statistics, verdict, where its audio lies in the clip, and how many times it was decoded again
after ending without a speech code: `retries`).
"""

from __future__ import annotations

import numpy as np

from engine.codec.join import join_audio
from engine.runtime.stages.row import Row
from engine.text.join import chunk_records, join_results


def join_row(row: Row, sample_rate: int) -> np.ndarray | str | None:
    """Make a split row's result and provenance its parts' joined; returns its joined audio,
    the reason it has none (a part's audio is missing), or None (a part failed: the row's
    result carries the error)."""
    results = [part.result for part in row.parts]
    joined = join_results(row.id, row.text, row.seed, results)
    res = row.result
    res.codes, res.finish_reason, res.stats = joined.codes, joined.finish_reason, joined.stats
    res.error, res.quality = joined.error, joined.quality
    clip, audio = None, None
    if res.error is None:
        silent = next((p for p in row.parts if p.kept is None or p.kept.wave is None), None)
        if silent is not None:  # the row's error names the chunk (and the commit record's failed rows do)
            audio = res.error = f"chunk {silent.id}: {silent.kept.error if silent.kept is not None else 'no audio'}"
        else:
            clip = join_audio([part.kept.wave for part in row.parts], sample_rate)
            audio = clip.wave
    records = chunk_records(row.plan.chunks, results, clip, sample_rate)
    for record, part in zip(records, row.parts):
        record["retries"] = len(part.retried)
    row.origin = {**row.origin, "chunks": records}
    return audio


def split_counts(rows: list[Row], written_rows: int | None) -> dict:
    """What a shard's commit record says of its split rows (nothing when none was split): how
    many, into how many chunks, how many of them were cut between words and at how many word
    boundaries, how many decodes again their chunks took (`chunk_retries`), and
    (`split_output: rows`) the rows written to its data."""
    split = [row for row in rows if row.parts]
    words = [sum(c.boundary == "word" for c in row.plan.chunks) for row in split]
    out = {"split_rows": len(split), "chunks": sum(len(row.parts) for row in split),
           "word_split_rows": sum(n > 0 for n in words), "word_cuts": sum(words),
           "chunk_retries": sum(row.retries() for row in split)} if split else {}
    return out if written_rows is None else {**out, "written_rows": written_rows}
