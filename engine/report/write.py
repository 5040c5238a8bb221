"""Writing the report: the output read, the sample drawn and fetched, the page rendered."""

from __future__ import annotations

from tqdm.auto import tqdm

from engine.config import StorageOptions
from engine.console import bar_disabled
from engine.io.storage import Storage, is_remote, join
from engine.report.figures import choose_sample, histograms
from engine.report.page import PageContent, render
from engine.report.read import ReportRow, open_output

__all__ = ["default_destination", "write_report"]

REPORT_NAME = "report.html"


def default_destination(output: str) -> str:
    """Where the report goes without `dest`: inside a local output (beside summary.json), and
    for an output on object storage, in the current folder as `<output's name>-report.html`."""
    output = output.rstrip("/")
    if is_remote(output):
        return f"{output.rsplit('/', 1)[-1]}-{REPORT_NAME}"
    return join(output, REPORT_NAME)


def _summary_text(summary: dict | None) -> str | None:
    if summary is None:
        return None
    from engine.runtime.summary import summary_table

    try:
        return summary_table(summary)
    except (KeyError, TypeError):  # a summary.json of another pcg-synth version: show it as written
        import json

        return json.dumps(summary, indent=1)


def write_report(output: str, dest: str | None = None, sample: int = 24, seed: int = 0,
                 storage_options: StorageOptions | None = None, progress: bool = True) -> dict:
    """Write the HTML report of the job output at `output`.

    Args:
        output: the job's output (a folder or an s3:// prefix: its output.uri), or a
            `pcg-synth convert` destination.
        dest: where to write the page (a path or a URI; default: `default_destination`).
        sample: rows to embed players for.
        seed: draws the sample (the same seed, the same rows).
        storage_options: how to reach object storage.
        progress: show a progress bar (shards read).

    Returns:
        {output, dest, format, shards, rows, ok, rejected, errors, cut, sampled, bytes}.

    Raises:
        ValueError: `output` is not a job output, no shard of it is committed, or `sample` < 0.
        StorageError: it cannot be read, or the page cannot be written.
    """
    if sample < 0:
        raise ValueError(f"--sample must be 0 or more; got {sample}")
    from engine import __version__

    storage = Storage(storage_options)
    out = open_output(storage, output)
    rows: list[ReportRow] = []
    bar = tqdm(total=len(out.committed), desc="report", unit="shard", disable=bar_disabled(progress))
    for shard in out.committed:
        rows.extend(out.rows(shard))
        bar.update()
    bar.close()
    chosen = choose_sample(rows, sample, seed)
    clips = out.clips(chosen)
    page = render(PageContent(out, rows, chosen, clips, histograms(rows), _summary_text(out.summary), sample, seed,
                              __version__)).encode()
    dest = dest or default_destination(output)
    storage.write_bytes(dest, page)
    return {"output": output, "dest": dest, "format": out.format, "shards": len(out.committed),
            "rows": len(rows), "ok": sum(r.status == "ok" for r in rows),
            "rejected": sum(r.status == "rejected" for r in rows), "errors": sum(r.status == "error" for r in rows),
            "cut": sum(r.cut for r in rows), "sampled": len([r for r in chosen if r.id in clips]), "bytes": len(page)}
