"""The errors the command line reports as one line (no traceback), defined without torch or Ray so
that `pcg-synth --help`, `--version` and a job spec's validation start in well under a second.
Each is raised by the module named in its docstring, which also exports it."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable


class ModelLoadError(ValueError):
    """A checkpoint directory is missing, incomplete or not a Llama causal LM (`engine.models.loading`)."""


class GroupBuildError(RuntimeError):
    """A slice of the distributed build failed on every attempt (`engine.groups.distributed`)."""


class ClusterUnreachable(ConnectionError):
    """Nothing answers at the Ray address given (`engine.connect`)."""


class JobFailed(RuntimeError):
    """The job cannot go on (e.g. workers fail to start); committed shards are kept (`engine.runtime.pool`)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping the driver, `kill`), raised where the main thread is by
    `raise_terminated`, so that the command stops as on Ctrl-C: a job's lease released, its
    committed shards kept."""


TERMINATED = threading.Event()  # set by `raise_terminated`: the stop was a SIGTERM, whatever re-raised it


def raise_terminated(signum, frame) -> None:
    """The CLI's SIGTERM handler (`signal.signal`). It also records the signal (`TERMINATED`):
    code it interrupts (Ray's waits) may turn the exception into a plain KeyboardInterrupt."""
    TERMINATED.set()
    raise Terminated()


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """" (did you mean 'temperature'?)" when `word` looks like a mistyped one of `names` (difflib's
    similarity >= 0.8 ignoring case: a letter or two wrong, missing or swapped), else ""."""
    lowered = {n.lower(): n for n in names if n != word}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.8)
    return f" (did you mean {lowered[found[0]]!r}?)" if found else ""


def field_errors(errors: Iterable[dict], whole: str) -> str:
    """Pydantic's validation errors (`ValidationError.errors()`) as one line, `field: message` each
    (`whole` names an error of the whole object), without the "Value error, " pydantic puts before
    a validator's own message."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or whole}: {plain_message(e['msg'])}" for e in errors)


def plain_message(msg: str) -> str:
    """A validator's message as it raised it (pydantic adds "Value error, " or "Assertion failed, ")."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg
