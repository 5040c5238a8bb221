"""The groups cache's `BlobStore` over the storage layer (a directory or an s3:// prefix)."""

from __future__ import annotations

from engine.io.storage import Storage, join


class StorageBlobStore:
    """Keys under `root`, through `Storage` (atomic local writes, single S3 PUTs)."""

    def __init__(self, storage: Storage, root: str) -> None:
        self.storage, self.root = storage, root

    def where(self, key: str) -> str:
        if "/" in key or key.startswith("."):
            raise ValueError(f"bad cache key {key!r}")
        return join(self.root, key)

    def exists(self, key: str) -> bool:
        return self.storage.exists(self.where(key))

    def get(self, key: str) -> bytes:
        return self.storage.read_bytes(self.where(key))

    def put(self, key: str, data: bytes) -> None:
        self.storage.write_bytes(self.where(key), data)
