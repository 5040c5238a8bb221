"""Read: a shard -> its manifest rows, validated (the first stage a row passes).

JSONL shards are read by byte range (a ranged GET); other manifests, and gzipped JSONL, are read
whole once and sliced per shard (the last two files are kept).
"""

from __future__ import annotations

from functools import lru_cache

from engine.io.manifest import ManifestRow, RowError, gzipped, parse_jsonl, parse_rows, unpacked, validated
from engine.io.storage import Storage
from engine.runtime.plan import Shard


class ReadStage:
    """A shard's rows, as the manifest gives them.

    Args:
        storage: reads the manifests.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._read_whole = lru_cache(maxsize=2)(self._parse_file)
        self._unpacked = lru_cache(maxsize=2)(self._unpack_file)  # gzipped JSONL: read once, sliced per shard

    def _parse_file(self, uri: str) -> list:
        return parse_rows(uri, self.storage.read_bytes(uri))

    def _unpack_file(self, uri: str) -> bytes:
        return unpacked(uri, self.storage.read_bytes(uri))

    def __call__(self, shard: Shard) -> list[ManifestRow | RowError]:
        """The shard's rows in manifest order; duplicates (found by the plan) become errors.

        Raises:
            RuntimeError: the manifest holds another number of rows than when it was planned.
        """
        if shard.byte_range is not None and gzipped(shard.manifest):
            raws = parse_jsonl(self._unpacked(shard.manifest)[slice(*shard.byte_range)])
        elif shard.byte_range is not None:
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
