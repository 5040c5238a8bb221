"""A Hugging Face Hub cache laid out as huggingface_hub writes it, built in a test from local
checkpoint folders (nothing downloaded)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_hub_cache(cache: Path, repo_id: str, source: Path, commit: str = COMMIT) -> None:
    """Put `source`'s files into `cache` as huggingface_hub stores a downloaded snapshot:
    content-addressed blobs, snapshot files linking to them, and refs/main naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
