"""A split row put back together: its chunks' codes in order (the row's codes), their
statistics summed, their quality verdicts combined, and a record per chunk. Their audio is
joined by `engine.codec.join`.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.codec.join import JoinedAudio, placed
from engine.records import QualityVerdict, SynthesisResult, aggregate


def join_codes(codes: Sequence[Sequence[int]]) -> list[int]:
    """The chunks' codes, in chunk order, as one row's codes."""
    return [int(c) for part in codes for c in part]


def joined_verdict(verdicts: Sequence[QualityVerdict]) -> QualityVerdict:
    """A split row's quality verdict from its chunks' (each checked, and decoded again, on its
    own): it passed when every chunk passed; its attempts are every chunk's, in chunk order; the
    attempt it names (whose scores fill the row's quality columns) is the worst chunk's kept
    one: the first chunk that failed, else the one with the highest CER."""
    attempts = [a for v in verdicts for a in v.attempts]
    offsets = [sum(len(v.attempts) for v in verdicts[:i]) for i in range(len(verdicts))]
    failed = [i for i, v in enumerate(verdicts) if not v.passed]
    worst = failed[0] if failed else max(range(len(verdicts)), key=lambda i: verdicts[i].kept.cer or 0.0)
    return QualityVerdict(attempts, offsets[worst] + verdicts[worst].chosen, not failed)


def join_results(row_id: str, text: str, row_seed: int, results: Sequence[SynthesisResult]) -> SynthesisResult:
    """A split row's result from its chunks' (in order): codes joined, statistics summed, the
    quality verdicts combined (`joined_verdict`, where every chunk has one). Its finish reason
    is `error` when a chunk failed (the first chunk error is the row's), `length` when a chunk
    was cut at its limit, else the last chunk's."""
    failed = next((r for r in results if r.error), None)
    if failed is not None:
        return SynthesisResult(id=row_id, text=text, seed=row_seed,
                               error=f"chunk {failed.id}: {failed.error}")
    reason = "length" if any(r.cut for r in results) else results[-1].finish_reason
    stats = [r.stats for r in results if r.stats is not None]
    verdicts = [r.quality for r in results]
    return SynthesisResult(id=row_id, text=text, seed=row_seed, codes=join_codes([r.codes for r in results]),
                           finish_reason=reason, stats=aggregate(stats) if stats else None,
                           quality=joined_verdict(verdicts) if all(verdicts) else None)


def chunk_records(chunks: Sequence, results: Sequence[SynthesisResult], joined: JoinedAudio | None = None,
                  sample_rate: int | None = None) -> list[dict]:
    """Per chunk of a split row, what the row keeps of it (its `chunks` field): text, where it
    lies in the row's text, the boundary it ends at, seed, codes, finish reason, decoding
    statistics, the quality gate's verdict (passed, attempts, CER; with the gate on), and where
    its audio lies in the joined clip (seconds, when `joined` is given).

    Args:
        chunks: the plan's `TextChunk`s.
        results: each chunk's result, aligned with `chunks`.
        joined: the row's joined audio, if any.
        sample_rate: of `joined`.
    """
    out = []
    for i, (chunk, res) in enumerate(zip(chunks, results)):
        record = {"index": i, **chunk.to_dict(), "seed": res.seed, "num_codes": len(res.codes),
                  "finish_reason": res.finish_reason, "error": res.error,
                  "stats": res.stats.to_dict() if res.stats is not None else None}
        if res.quality is not None:
            record["quality"] = {"passed": res.quality.passed, "attempts": len(res.quality.attempts),
                                 "cer": res.quality.kept.cer}
        if joined is not None and sample_rate:
            record.update(placed(joined, i, sample_rate))
        out.append(record)
    return out
