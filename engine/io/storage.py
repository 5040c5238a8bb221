"""The storage layer: the only code that touches URIs, boto3 or pyarrow filesystems.

URIs: plain local paths, `file:///abs/path`, and `s3://bucket/key` (AWS or any S3-compatible
endpoint). Credentials come from the standard AWS chain (environment, ~/.aws profiles,
instance/role credentials) and never appear in messages: errors name the URI and the service's
error code only.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from engine.config import StorageOptions


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI, never credentials."""


@dataclass(frozen=True)
class Location:
    scheme: str  # "file" | "s3"
    bucket: str  # "" for local
    path: str  # local absolute path, or the S3 key

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.path}" if self.scheme == "s3" else self.path


def parse(uri: str | os.PathLike) -> Location:
    """Split a URI; local paths are made absolute.

    Raises:
        StorageError: an unsupported scheme or an S3 URI without a bucket.
    """
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{text}: an s3:// URI needs a bucket (s3://bucket/key)")
        return Location("s3", parsed.netloc, parsed.path.lstrip("/"))
    if parsed.scheme == "file":
        return Location("file", "", str(Path(parsed.path).resolve()))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive, a path
        raise StorageError(f"{text}: unsupported scheme {parsed.scheme!r} (use a path, file:// or s3://)")
    return Location("file", "", str(Path(text).resolve()))


def join(base: str, *parts: str) -> str:
    """Join URI parts with '/' (local paths too)."""
    out = os.fspath(base).rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def relative_to(manifest: str, ref: str) -> str:
    """A clip reference from a manifest row: absolute URIs stay, relative ones are taken from
    the manifest's folder."""
    if "://" in ref or ref.startswith("/"):
        return ref
    loc = parse(manifest)
    base = str(PurePosixPath(loc.path).parent / ref)
    return f"s3://{loc.bucket}/{base}" if loc.scheme == "s3" else base


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a local file via a temporary sibling and a rename: readers never see half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_remote(uri: str) -> bool:
    return parse(uri).scheme == "s3"


class Storage:
    """Read, write and list objects by URI.

    Args:
        options: S3 endpoint/region/profile; irrelevant for local URIs.
    """

    def __init__(self, options: StorageOptions | None = None) -> None:
        self.options = options or StorageOptions()
        self._s3 = None
        self._arrow_s3 = None

    # ---- S3 plumbing -------------------------------------------------------------------------

    def _session(self):
        import boto3

        return boto3.session.Session(profile_name=self.options.profile,
                                     region_name=self.options.region)

    @property
    def s3(self):
        if self._s3 is None:
            self._s3 = self._session().client("s3", endpoint_url=self.options.endpoint_url)
        return self._s3

    def _fail(self, loc: Location, action: str, exc: Exception) -> StorageError:
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            why = "no AWS credentials found (environment, ~/.aws profile or instance role)"
        elif isinstance(exc, EndpointConnectionError):
            why = "cannot reach the S3 endpoint"
        elif isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            why = f"{err.get('Code', 'error')}: {err.get('Message', '')}".strip(": ")
        else:
            why = type(exc).__name__
        return StorageError(f"cannot {action} {loc.uri}: {why}")

    # ---- operations ------------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        loc = parse(uri)
        if loc.scheme == "file":
            return Path(loc.path).is_file()
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=loc.bucket, Key=loc.path)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(loc, "check", exc) from None
        except Exception as exc:  # noqa: BLE001 - converted to a credential-free message
            raise self._fail(loc, "check", exc) from None

    def read_bytes(self, uri: str) -> bytes:
        loc = parse(uri)
        if loc.scheme == "file":
            try:
                return Path(loc.path).read_bytes()
            except OSError as exc:
                raise StorageError(f"cannot read {loc.uri}: {exc.strerror}") from None
        try:
            return self.s3.get_object(Bucket=loc.bucket, Key=loc.path)["Body"].read()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(loc, "read", exc) from None

    def read_range(self, uri: str, start: int, stop: int) -> bytes:
        """Bytes `[start, stop)` of an object (an S3 ranged GET; a seek locally)."""
        if stop <= start:
            return b""
        loc = parse(uri)
        if loc.scheme == "file":
            try:
                with open(loc.path, "rb") as f:
                    f.seek(start)
                    return f.read(stop - start)
            except OSError as exc:
                raise StorageError(f"cannot read {loc.uri}: {exc.strerror}") from None
        try:
            obj = self.s3.get_object(Bucket=loc.bucket, Key=loc.path, Range=f"bytes={start}-{stop - 1}")
            return obj["Body"].read()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(loc, "read", exc) from None

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write atomically: a temporary file renamed into place, or one S3 PUT."""
        loc = parse(uri)
        if loc.scheme == "file":
            write_atomic(loc.path, data)
            return
        try:
            self.s3.put_object(Bucket=loc.bucket, Key=loc.path, Body=data)
        except Exception as exc:  # noqa: BLE001
            raise self._fail(loc, "write", exc) from None

    def delete(self, uri: str) -> None:
        loc = parse(uri)
        if loc.scheme == "file":
            Path(loc.path).unlink(missing_ok=True)
            return
        try:
            self.s3.delete_object(Bucket=loc.bucket, Key=loc.path)
        except Exception as exc:  # noqa: BLE001
            raise self._fail(loc, "delete", exc) from None

    def list(self, prefix: str) -> list[str]:
        """URIs of all objects under the "directory" `prefix` (or the object itself), sorted.
        `s3://b/run` lists `run` and `run/...`, not `run2/...`, as a local directory would.
        Hidden local files (leading '.', e.g. in-flight temporaries) are skipped."""
        loc = parse(prefix)
        if loc.scheme == "file":
            root = Path(loc.path)
            style = "file://" if os.fspath(prefix).startswith("file://") else ""  # answer in kind
            if root.is_file():
                return [style + str(root)]
            if not root.is_dir():
                return []
            return sorted(style + str(p) for p in root.rglob("*")
                          if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
        out = []
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.path)
            base = loc.path.rstrip("/")
            for page in pages:
                out.extend(f"s3://{loc.bucket}/{obj['Key']}" for obj in page.get("Contents", [])
                           if not base or obj["Key"] == base or obj["Key"].startswith(base + "/"))
        except Exception as exc:  # noqa: BLE001
            raise self._fail(loc, "list", exc) from None
        return sorted(out)

    def arrow_filesystem(self, uri: str):
        """(pyarrow FileSystem, path inside it) for reading/writing Parquet at `uri`."""
        import pyarrow.fs as pafs

        loc = parse(uri)
        if loc.scheme == "file":
            return pafs.LocalFileSystem(), loc.path
        if self._arrow_s3 is None:
            creds = self._session().get_credentials()
            frozen = creds.get_frozen_credentials() if creds else None
            kwargs = {"region": self.options.region or self._session().region_name or "us-east-1"}
            if frozen is not None:
                kwargs.update(access_key=frozen.access_key, secret_key=frozen.secret_key,
                              session_token=frozen.token)
            if self.options.endpoint_url:
                ep = urlparse(self.options.endpoint_url)
                kwargs.update(endpoint_override=ep.netloc, scheme=ep.scheme or "https")
            self._arrow_s3 = pafs.S3FileSystem(**kwargs)
        return self._arrow_s3, f"{loc.bucket}/{loc.path}"

    def local_dir(self, uri: str, cache_root: str | os.PathLike | None = None) -> Path:
        """A local directory with the contents of `uri`: the path itself for local URIs; for
        s3:// a copy under `cache_root` (default `$PCG_SYNTH_CACHE/models` or
        `~/.cache/pcg-synth/models`), fetched once and reused while object sizes match.

        Raises:
            StorageError: nothing under `uri`, or a download failed.
        """
        loc = parse(uri)
        if loc.scheme == "file":
            return Path(loc.path)
        import hashlib

        root = Path(cache_root) if cache_root else Path(
            os.environ.get("PCG_SYNTH_CACHE", Path.home() / ".cache" / "pcg-synth")) / "models"
        dest = root / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
        prefix = loc.path.rstrip("/") + "/"
        objects = [u for u in self.list(uri) if parse(u).path.startswith(prefix)]
        if not objects:
            raise StorageError(f"nothing to fetch under {uri}")
        for obj in objects:
            key = parse(obj).path
            target = dest / key[len(prefix):]
            size = self.s3.head_object(Bucket=loc.bucket, Key=key)["ContentLength"]
            if target.is_file() and target.stat().st_size == size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.part")
            try:
                self.s3.download_file(loc.bucket, key, str(tmp))
            except Exception as exc:  # noqa: BLE001
                raise self._fail(Location("s3", loc.bucket, key), "fetch", exc) from None
            os.replace(tmp, target)
        return dest
