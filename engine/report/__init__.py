"""`pcg-synth report OUT`: a job's output as one static HTML page to read and listen to.

The page (docs/guides/report.md) holds the job's summary, histograms of duration, speaking rate,
acceptance and the quality gate's scores, players for a sample of rows (rejects and rows cut at
the token limit among them), a sortable table of every row, and the rejects and error records
with their reasons. It is one self-contained file: styles, script and figures inline and the
sample's clips embedded as data URIs, so it opens offline, from anywhere it is copied to. Only the
sample's audio is read and embedded: the page grows with the row count by a table row each, not
by the dataset's audio.

    from engine.report import write_report
    done = write_report("out/quickstart")          # -> out/quickstart/report.html
"""

from __future__ import annotations

__all__ = ["default_destination", "write_report"]


def __getattr__(name: str):
    # loaded on first use: `pcg-synth --help` registers the command without pyarrow or numpy
    if name in __all__:
        from engine.report import write

        return getattr(write, name)
    raise AttributeError(f"module 'engine.report' has no attribute {name!r}")
