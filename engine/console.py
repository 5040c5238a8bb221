"""What the command line prints besides its results: quiet by default, more with `--verbose`.

Quiet (the default for `pcg-synth`): progress bars only on a terminal (never into a log file or a
pipe), Ray's start-up notices (token authentication) and the libraries' progress bars and INFO
logs hidden; warnings and errors still show. Verbose: every progress bar, also into logs, and
the libraries' own messages. Library use (the Python API) is untouched: there a bar shows
whenever its caller asks for one.
"""

from __future__ import annotations

import logging
import os
import sys

_cli: bool = False
_verbose: bool = False


def configure(verbose: bool = False) -> None:
    """Set the command line's verbosity; call before Ray, transformers or huggingface_hub load."""
    global _cli, _verbose
    _cli, _verbose = True, verbose
    if verbose:  # the engine's own log (e.g. Ray's whole report of a worker's death) on stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        engine_log = logging.getLogger("engine")
        engine_log.addHandler(handler)
        engine_log.setLevel(logging.INFO)
        return
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    if not sys.stderr.isatty():
        # transformers and huggingface_hub read this when they load: no bars in logs
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 shard`, `2 shards`, `0 shards`; `plural` for a noun that does not just add an s."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def verbose() -> bool:
    return _verbose


def bar_disabled(progress: bool = True) -> bool | None:
    """tqdm's `disable` for a bar its caller wants (`progress`): on the command line shown on a
    terminal only (None: tqdm decides by the stream), always with `--verbose`."""
    if not progress:
        return True
    return None if _cli and not _verbose else False
