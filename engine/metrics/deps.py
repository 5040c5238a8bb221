"""Optional backends: import them on demand, or fail with the package and extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingBackend(ImportError, ValueError):
    """An optional package is not installed. A ValueError too, so the CLI prints it as a
    one-line user error rather than a traceback."""


def require(module: str, package: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise `MissingBackend` naming what to install.

    Args:
        module: the import name, e.g. "jiwer".
        package: the PyPI name, e.g. "jiwer".
        extra: the pcg-synth extra that installs it, e.g. "quality".
        purpose: what needs it, for the message ("WER/CER").
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingBackend(
            f"{purpose} needs the Python package '{package}', which is not installed: "
            f"pip install 'pcg-synth[{extra}]' (or pip install {package}) [{exc}]") from exc
