"""The storage layer: the only code that touches URIs, boto3, fsspec, pyarrow filesystems or
the Hugging Face Hub.

URIs: plain local paths, `file:///abs/path`, `s3://bucket/key` (boto3: AWS or any S3-compatible
endpoint), and any other scheme fsspec knows (`gs://` with the `gcs` extra, `az://`/`abfs://`
with the `azure` extra, `memory://`, ...). S3 credentials come from the standard AWS chain
(environment, ~/.aws profiles, instance/role credentials), other stores' from their fsspec
library's own chain; they never appear in messages: errors name the URI and the error's kind.

Model directories (`model_dir`, `Storage.local_dir`) may also be Hugging Face Hub models:
`org/name`, `org/name@revision` or `hf://org/name[@revision]`, fetched by `huggingface_hub` into
its cache (HF_HOME / HF_HUB_CACHE; HF_HUB_OFFLINE=1 uses the cache only). An existing local
path always wins over the Hub reading of the same text.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from engine.config import StorageOptions, hub_model_id
from engine.console import counted
from engine.io import files
from engine.io.files import write_atomic

__all__ = ["write_atomic"]  # re-exported: local writers import it from here

# Schemes this module serves itself; every other scheme fsspec knows goes through fsspec.
OWN_SCHEMES = ("file", "s3")
# fsspec schemes whose package comes with one of this project's extras
EXTRAS = {"gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure"}


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI, never credentials."""


class WriteFailed(StorageError):
    """A write failed for a reason retrying soon will not cure (no space left, a quota, a
    read-only filesystem, no permission): a job stops at once instead of retrying its shards.

    Attributes:
        uri: what could not be written.
        why: the cause, e.g. `No space left on device`.
        remedy: what to do, e.g. `free space on its filesystem`.
    """

    def __init__(self, uri: str, why: str, remedy: str) -> None:
        super().__init__(f"cannot write {uri}: {why}")
        self.uri, self.why, self.remedy = uri, why, remedy

    def __reduce__(self):  # crosses process boundaries (Ray) with its fields
        return type(self), (self.uri, self.why, self.remedy)


log = logging.getLogger(__name__)
RETRY_LOG_EVERY_S = 2.0  # at most one retry line per this many seconds per process; the rest are counted


class RetryLog:
    """One log line per storage backoff, at most one every `every_s` seconds of `clock` (an outage
    can make many calls back off at once); the lines held back are counted in the next one."""

    def __init__(self, every_s: float = RETRY_LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock, self.last, self.held = every_s, clock, float("-inf"), 0
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            now = self.clock()
            if now - self.last < self.every_s:
                self.held += 1
                return
            held, self.held, self.last = self.held, 0, now
        log.warning("storage: %s%s", text, f" ({counted(held, 'more retry', 'more retries')} since the last line)"
                    if held else "")


retry_log = RetryLog()


# S3 error codes that mean "try again later" (besides any HTTP 5xx)
TRANSIENT_CODES = {"Throttling", "ThrottlingException", "ThrottledException", "SlowDown", "RequestLimitExceeded",
                   "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException", "InternalError",
                   "ServiceUnavailable", "503", "500"}


def backoff_s(retry: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Wait before retry number `retry` (1, 2, ...): `base * 2**(retry - 1)`, capped at `cap`,
    times a random 50-100 % (jitter: clients retrying after a common outage spread out)."""
    if base <= 0:
        return 0.0
    return min(cap, base * 2 ** (retry - 1)) * (0.5 + 0.5 * (rng or random).random())


def transient(exc: BaseException) -> bool:
    """Whether a storage error may go away by itself: connection refused/reset/closed, timeouts,
    HTTP 5xx, throttling. Missing objects, denied access and bad requests are not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):  # builtins: fsspec backends, sockets
        return True
    try:
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return False
    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or status == 429 or str(err.get("Code")) in TRANSIENT_CODES
    return isinstance(exc, BotoCoreError) and "Timeout" in type(exc).__name__


@dataclass(frozen=True)
class Location:
    scheme: str  # "file" | "s3" | another fsspec protocol ("gs", "az", "memory", ...)
    bucket: str  # the S3 bucket; "" otherwise
    path: str  # local absolute path, the S3 key, or the fsspec path after "scheme://"

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            return self.path
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.path}"
        return f"{self.scheme}://{self.path}"


def parse(uri: str | os.PathLike) -> Location:
    """Split a URI; local paths are made absolute.

    Raises:
        StorageError: a scheme neither this module nor fsspec knows, or an S3 URI without a bucket.
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
        import fsspec

        if "://" not in text or parsed.scheme not in fsspec.available_protocols():
            raise StorageError(f"{text}: unsupported scheme {parsed.scheme!r} (use a path, file://, s3://, "
                               "or a scheme fsspec knows, e.g. gs:// or az://)")
        return Location(parsed.scheme, "", text.split("://", 1)[1])
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
    return Location(loc.scheme, loc.bucket, base).uri


class file_lock:  # noqa: N801 - used as a context manager, like open()
    """An exclusive `flock` on `path` (created if missing): processes on one machine (the Ray
    workers of a node) take turns; the lock goes with the process if it dies."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> file_lock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def local_write(uri: str, write: Callable[[], object]):
    """`write()`, its OSError turned into a one-line error naming `uri` and the cause."""
    try:
        return write()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if (remedy := files.remedy(exc)) is not None:
            raise WriteFailed(uri, why, remedy) from None
        raise StorageError(f"cannot write {uri}: {why}") from None


def file_md5(path: Path) -> str:
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_remote(uri: str) -> bool:
    """Not on this machine's disk: an object-store URI or a Hub model id."""
    return hub_ref(uri) is not None or parse(uri).scheme != "file"


def cache_dir() -> Path:
    """This user's pcg-synth cache: `$PCG_SYNTH_CACHE`, else `~/.cache/pcg-synth` (fetched
    models, groups, the bench's tiny kit)."""
    root = os.environ.get("PCG_SYNTH_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "pcg-synth"


# ---- Hugging Face Hub models ---------------------------------------------------------------------


@dataclass(frozen=True)
class HubRef:
    """A model on the Hugging Face Hub: repository id and optional revision (branch, tag, commit)."""

    repo_id: str
    revision: str | None = None
    explicit: bool = False  # written hf://... (else it could have been a local path)

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def hub_ref(ref: str | os.PathLike) -> HubRef | None:
    """The Hub model `ref` names, or None for a path or URI.

    `hf://org/name[@revision]` is always a Hub model. `org/name[@revision]` is one unless a local
    file or directory of that spelling exists (relative to the working directory): an existing
    local path wins.

    Raises:
        StorageError: an `hf://` reference that is not `hf://org/name[@revision]`.
    """
    text = os.fspath(ref)
    if text.startswith("hf://"):
        found = hub_model_id(text)
        if found is None:
            raise StorageError(f"{text}: a Hub model is hf://org/name or hf://org/name@revision")
        return HubRef(*found, explicit=True)
    if os.path.exists(text):
        return None
    found = hub_model_id(text)
    return HubRef(*found) if found else None


def _hub_failure(ref: HubRef, exc: Exception) -> StorageError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = constants.HF_HUB_CACHE
    get = (f"download it where the Hub is reachable (`hf download {ref.repo_id}"
           + (f" --revision {ref.revision}" if ref.revision else "")
           + "` with HF_HOME or HF_HUB_CACHE pointing at this cache), or pass a local directory")
    if isinstance(exc, GatedRepoError):
        why = "it is gated: accept its terms on the Hub and log in (`hf auth login` or HF_TOKEN)"
    elif isinstance(exc, RepositoryNotFoundError):
        why = ("no such model on the Hub (or it is private: log in with `hf auth login` or HF_TOKEN), "
               "and no local directory of that name")
    elif isinstance(exc, RevisionNotFoundError):
        why = f"the model has no revision {ref.revision!r}"
    elif isinstance(exc, LocalEntryNotFoundError) or constants.HF_HUB_OFFLINE:
        mode = "HF_HUB_OFFLINE=1 forbids downloading" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        why = f"not in the Hugging Face cache ({cache}) and {mode}; {get}"
    else:
        why = f"{type(exc).__name__} ({cache}); {get}"
    local = "" if ref.explicit else f"no local directory {ref}; as a Hugging Face model: "
    return StorageError(f"{local or 'Hugging Face model ' + str(ref) + ': '}{why}")


STREAMS_INFO = "pcg_streams.json"  # what marks a directory of stream heads (`engine.models.streams`)


def hub_snapshot(ref: HubRef, config_only: bool = False, only: tuple[str, ...] = ()) -> Path:
    """The local snapshot directory of a Hub model, downloaded into huggingface_hub's cache on
    first use (offline: from the cache only). `config_only` fetches just `config.json`, `only`
    just those files.

    Raises:
        StorageError: not cached while offline, unknown model or revision, no access.
    """
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(ref.repo_id, revision=ref.revision, local_files_only=constants.HF_HUB_OFFLINE,
                                      allow_patterns=["config.json"] if config_only else list(only) or None))
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's errors become one message
        raise _hub_failure(ref, exc) from None


def model_dir(ref: str | os.PathLike, storage: Storage | None = None) -> Path:
    """A local directory holding the model `ref` names: a local path (as is), a Hub model (its
    cached snapshot) or an object-store URI (a cached copy). See `Storage.local_dir`."""
    return (storage or Storage()).local_dir(ref)


class Storage:
    """Read, write and list objects by URI.

    Args:
        options: S3 endpoint/region/profile; irrelevant for local URIs.
    """

    def __init__(self, options: StorageOptions | None = None) -> None:
        self.options = options or StorageOptions()
        self._s3 = None
        self._arrow_s3 = None
        self.retries = 0  # transient failures retried so far (this object)
        self.retry_wait_s = 0.0  # seconds spent waiting before those retries
        self._sleep = time.sleep

    def _retrying(self, call: Callable[[], object], fail: Callable[[Exception], StorageError]):
        """`call()`, retried after a transient failure (`transient`) up to `options.retries`
        times with exponential backoff and jitter, each backoff logged (`retry_log`: the
        operation, URI, cause, retry number and wait); any other failure, or the last one,
        becomes `fail(exc)` (a StorageError naming the URI)."""
        opts = self.options
        attempt = 0
        while True:
            try:
                return call()
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - converted to a credential-free message
                if attempt < opts.retries and transient(exc):
                    attempt += 1
                    wait = backoff_s(attempt, opts.retry_backoff_s, opts.retry_backoff_max_s)
                    self.retries += 1
                    self.retry_wait_s += wait
                    retry_log(f"{fail(exc)}; retry {attempt} of {opts.retries} in {wait:.1f} s")
                    self._sleep(wait)
                    continue
                error = fail(exc)
                if attempt:
                    error = StorageError(f"{error} (after {counted(attempt, 'retry', 'retries')})")
                raise error from None

    def _s3_call(self, loc: Location, action: str, call: Callable[[], object]):
        return self._retrying(call, lambda exc: self._fail(loc, action, exc))

    def _fs_call(self, loc: Location, action: str, call: Callable[[], object]):
        return self._retrying(call, lambda exc: self._fs_fail(loc, action, exc))

    # ---- S3 plumbing -------------------------------------------------------------------------

    def _session(self):
        import boto3

        return boto3.session.Session(profile_name=self.options.profile,
                                     region_name=self.options.region)

    @property
    def s3(self):
        if self._s3 is None:
            from botocore.config import Config

            # botocore's own retries are quick (standard mode, 3 attempts); `_retrying` waits
            # longer, across outages
            self._s3 = self._session().client("s3", endpoint_url=self.options.endpoint_url,
                                              config=Config(retries={"mode": "standard", "max_attempts": 3}))
        return self._s3

    def _fail(self, loc: Location, action: str, exc: Exception) -> StorageError:
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            why = "no AWS credentials found (environment, ~/.aws profile or instance role)"
        elif isinstance(exc, EndpointConnectionError):
            url = urlparse((getattr(exc, "kwargs", None) or {}).get("endpoint_url") or self.options.endpoint_url or "")
            why = "cannot reach the S3 endpoint" + (f" {url.scheme}://{url.netloc}" if url.netloc else "")
            if not self.options.endpoint_url:
                why += " (AWS, the default: storage.endpoint_url names another S3 service)"
        elif isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            why = f"{err.get('Code', 'error')}: {err.get('Message', '')}".strip(": ")
        else:
            why = type(exc).__name__
        return StorageError(f"cannot {action} {loc.uri}: {why}")

    # ---- fsspec plumbing (every scheme but file and s3) ---------------------------------------

    def _fs(self, loc: Location):
        """(fsspec filesystem, path inside it) for `loc`."""
        from fsspec.core import url_to_fs

        try:
            return url_to_fs(loc.uri)
        except ImportError as exc:
            extra = EXTRAS.get(loc.scheme)
            how = f"pip install 'pcg-synth[{extra}]'" if extra else str(exc)
            raise StorageError(f"{loc.uri}: the {loc.scheme}:// filesystem is not installed ({how})") from None

    @staticmethod
    def _fs_fail(loc: Location, action: str, exc: Exception) -> StorageError:
        if isinstance(exc, FileNotFoundError):
            why = "no such object"
        elif isinstance(exc, PermissionError):
            why = "permission denied"
        else:
            why = type(exc).__name__
        return StorageError(f"cannot {action} {loc.uri}: {why}")

    # ---- operations ------------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        loc = parse(uri)
        if loc.scheme == "file":
            return Path(loc.path).is_file()
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)
            return self._fs_call(loc, "check", lambda: fs.isfile(path))
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                self.s3.head_object(Bucket=loc.bucket, Key=loc.path)
                return True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

        return self._s3_call(loc, "check", head)

    def read_bytes(self, uri: str) -> bytes:
        loc = parse(uri)
        if loc.scheme == "file":
            try:
                return Path(loc.path).read_bytes()
            except OSError as exc:
                raise StorageError(f"cannot read {loc.uri}: {exc.strerror}") from None
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)
            return self._fs_call(loc, "read", lambda: fs.cat_file(path))
        return self._s3_call(loc, "read",
                             lambda: self.s3.get_object(Bucket=loc.bucket, Key=loc.path)["Body"].read())

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
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)
            return self._fs_call(loc, "read", lambda: fs.cat_file(path, start=start, end=stop))
        return self._s3_call(loc, "read", lambda: self.s3.get_object(
            Bucket=loc.bucket, Key=loc.path, Range=f"bytes={start}-{stop - 1}")["Body"].read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write atomically: a temporary file fsynced and renamed into place (the folder fsynced
        after: durable once this returns), or one object PUT.

        Raises:
            WriteFailed: a local write failed for a lasting reason (no space, quota, read-only,
                permission); StorageError: any other failure, naming the URI.
        """
        loc = parse(uri)
        if loc.scheme == "file":
            local_write(loc.uri, lambda: write_atomic(loc.path, data))
            return
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)
            self._fs_call(loc, "write", lambda: fs.pipe_file(path, data))
            return
        self._s3_call(loc, "write", lambda: self.s3.put_object(Bucket=loc.bucket, Key=loc.path, Body=data))

    def create_new(self, uri: str, data: bytes) -> bool:
        """Create `uri` holding `data` unless it exists: of several writers at once exactly one
        succeeds. A local exclusive create (O_CREAT | O_EXCL); on S3 a conditional PUT
        (`If-None-Match: *`); on another fsspec store its `pipe_file(mode="create")`, atomic
        where that store implements it, a check-then-write where it does not.

        Returns:
            False when `uri` exists already.
        """
        loc = parse(uri)
        if loc.scheme == "file":
            return local_write(loc.uri, lambda: files.create_new(loc.path, data))
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)

            def create() -> bool:
                try:
                    fs.pipe_file(path, data, mode="create")
                except FileExistsError:
                    return False
                return True

            return self._fs_call(loc, "create", create)
        from botocore.exceptions import ClientError

        def put() -> bool:
            try:
                self.s3.put_object(Bucket=loc.bucket, Key=loc.path, Body=data, IfNoneMatch="*")
            except ClientError as exc:
                # 412: it exists; 409: another conditional write of it is under way (it will exist)
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                raise
            return True

        return self._s3_call(loc, "create", put)

    def read_versioned(self, uri: str) -> tuple[bytes, str | None] | None:
        """`uri`'s bytes and version (an object's ETag; None for files, which `write_if` does not
        compare), or None if it does not exist."""
        loc = parse(uri)
        if loc.scheme != "s3":
            return (self.read_bytes(uri), None) if self.exists(uri) else None
        from botocore.exceptions import ClientError

        def get() -> tuple[bytes, str | None] | None:
            try:
                got = self.s3.get_object(Bucket=loc.bucket, Key=loc.path)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
            return got["Body"].read(), got["ETag"]

        return self._s3_call(loc, "read", get)

    def write_if(self, uri: str, data: bytes, version: str | None) -> bool:
        """Write `uri` only if it is still as read (`read_versioned`): on S3 a conditional PUT,
        `If-Match: version`, or `If-None-Match: *` for `version` None (it did not exist); other
        stores write (their callers hold a lock, or accept check-then-write).

        Returns:
            False when the object changed (or appeared) since it was read.
        """
        loc = parse(uri)
        if loc.scheme != "s3":
            self.write_bytes(uri, data)
            return True
        from botocore.exceptions import ClientError

        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}

        def put() -> bool:
            try:
                self.s3.put_object(Bucket=loc.bucket, Key=loc.path, Body=data, **condition)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict",
                                                                  "NoSuchKey"):
                    return False
                raise
            return True

        return self._s3_call(loc, "write", put)

    def refresh(self, uri: str, data: bytes) -> bool:
        """Mark `uri`, which holds `data`, as modified now (a lease's renewal): a local file's
        modification time is set (no space needed: it works on a full disk); an object is
        written again.

        Returns:
            False when a local file is gone (an object is written again regardless).
        """
        loc = parse(uri)
        if loc.scheme == "file":
            try:
                os.utime(loc.path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise StorageError(f"cannot refresh {loc.uri}: {exc.strerror}") from None
            return True
        self.write_bytes(uri, data)
        return True

    def modified(self, uri: str) -> float | None:
        """When `uri` was last written (seconds since the epoch: the local clock, or the object
        store's), or None if it does not exist."""
        loc = parse(uri)
        if loc.scheme == "file":
            try:
                return os.stat(loc.path).st_mtime
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise StorageError(f"cannot check {loc.uri}: {exc.strerror}") from None
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)

            def when() -> float | None:
                try:
                    return fs.modified(path).timestamp()
                except FileNotFoundError:
                    return None

            return self._fs_call(loc, "check", when)
        from botocore.exceptions import ClientError

        def head() -> float | None:
            try:
                return self.s3.head_object(Bucket=loc.bucket, Key=loc.path)["LastModified"].timestamp()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise

        return self._s3_call(loc, "check", head)

    def absent_folders(self, uri: str) -> list[str]:
        """The local folder `uri` and its parents that do not exist yet, innermost first (what
        writing there will create); [] for object stores, which have no folders."""
        loc = parse(uri)
        if loc.scheme != "file":
            return []
        path, out = Path(loc.path), []
        while not path.exists() and path != path.parent:
            out.append(str(path))
            path = path.parent
        return out

    def remove_empty_folders(self, uri: str) -> None:
        """Remove the local folder `uri` and the folders under it if none holds a file (what a
        job refused before any work leaves); object stores have no folders to remove."""
        loc = parse(uri)
        if loc.scheme == "file":
            files.remove_empty_dirs(loc.path)

    def delete(self, uri: str) -> None:
        loc = parse(uri)
        if loc.scheme == "file":
            Path(loc.path).unlink(missing_ok=True)
            return
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)

            def remove() -> None:
                if fs.isfile(path):
                    fs.rm_file(path)

            self._fs_call(loc, "delete", remove)
            return
        self._s3_call(loc, "delete", lambda: self.s3.delete_object(Bucket=loc.bucket, Key=loc.path))

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
        if loc.scheme not in OWN_SCHEMES:
            return [u for u, _ in self._fs_list(loc)]
        return [u for u, _ in self._s3_list(loc)]

    def _s3_list(self, loc: Location) -> list[tuple[str, int]]:
        """(URI, size) of every S3 object under `loc` (or `loc` itself), sorted; the whole
        listing is retried after a transient failure."""
        base = loc.path.rstrip("/")

        def listing() -> list[tuple[str, int]]:
            out = []
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.path)
            for page in pages:
                out.extend((f"s3://{loc.bucket}/{obj['Key']}", int(obj.get("Size", 0)))
                           for obj in page.get("Contents", [])
                           if not base or obj["Key"] == base or obj["Key"].startswith(base + "/"))
            return sorted(out)

        return self._s3_call(loc, "list", listing)

    def _fs_list(self, loc: Location) -> list[tuple[str, int]]:
        """(URI, size) of every object under `loc` (or `loc` itself), sorted."""
        fs, path = self._fs(loc)

        def find() -> dict:
            if fs.isfile(path):
                return {path: fs.info(path)}
            return fs.find(path.rstrip("/"), detail=True) if fs.isdir(path) else {}

        found = self._fs_call(loc, "list", find)
        strip = path.rstrip("/")
        out = []
        for name, info in found.items():
            if info.get("type", "file") != "file" or not name.startswith(strip):
                continue
            out.append((loc.uri.rstrip("/") + name[len(strip):], int(info.get("size") or 0)))
        return sorted(out)

    def arrow_filesystem(self, uri: str):
        """(pyarrow FileSystem, path inside it) for reading/writing Parquet at `uri`."""
        import pyarrow.fs as pafs

        loc = parse(uri)
        if loc.scheme == "file":
            return pafs.LocalFileSystem(), loc.path
        if loc.scheme not in OWN_SCHEMES:
            fs, path = self._fs(loc)
            return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path
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

    def local_dir(self, uri: str | os.PathLike, cache_root: str | os.PathLike | None = None) -> Path:
        """A local directory with the contents of `uri`: the path itself for local paths; a Hub
        model's cached snapshot (see `hub_ref`); for object-store URIs (s3:// and fsspec's) a
        copy under `cache_root` (default `cache_dir()/models`), fetched once and reused while
        object sizes match.

        Raises:
            StorageError: nothing under `uri`, a Hub model not to be had, or a download failed.
        """
        hub = hub_ref(uri)
        if hub is not None:
            return hub_snapshot(hub)
        uri = os.fspath(uri)
        loc = parse(uri)
        if loc.scheme == "file":
            return Path(loc.path)
        import hashlib

        root = Path(cache_root) if cache_root else cache_dir() / "models"
        dest = root / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
        prefix_uri = loc.uri.rstrip("/") + "/"
        if loc.scheme in OWN_SCHEMES:
            objects = [(u, size) for u, size in self._s3_list(loc) if u.startswith(prefix_uri)]
        else:
            objects = [(u, size) for u, size in self._fs_list(loc) if u.startswith(prefix_uri)]
        if not objects:
            raise StorageError(f"nothing to fetch under {uri}")
        dest.mkdir(parents=True, exist_ok=True)
        with file_lock(dest.with_name(dest.name + ".lock")):  # the workers of a node share one download
            for obj, size in objects:
                target = dest / obj[len(prefix_uri):]
                if target.is_file() and target.stat().st_size == size:
                    continue
                self._fetch_one(parse(obj), target, size)
        return dest

    def _fetch_one(self, src: Location, target: Path, size: int) -> None:
        """Download one object to `target` through a `.part` file unique to this process, check
        its size against the listing (and, on S3, its MD5 where the ETag is one: single-part
        uploads), then rename it into place. Retried like every call."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{random.getrandbits(32):08x}.part")

        def fetch() -> None:
            try:
                if src.scheme == "s3":
                    self.s3.download_file(src.bucket, src.path, str(tmp))
                    etag = str(self.s3.head_object(Bucket=src.bucket, Key=src.path).get("ETag", "")).strip('"')
                else:
                    fs, path = self._fs(src)
                    fs.get_file(path, str(tmp))
                    etag = ""
                got = tmp.stat().st_size
                if got != size:
                    raise ConnectionError(f"{got} bytes received where the listing says {size}")
                if len(etag) == 32 and "-" not in etag and file_md5(tmp) != etag:
                    raise ConnectionError("MD5 differs from the object's ETag")
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, target)

        if src.scheme == "s3":
            self._s3_call(src, "fetch", fetch)
        else:
            self._fs_call(src, "fetch", fetch)

    def has_checkpoint(self, ref: str, markers: tuple[str, ...] = ("config.json",)) -> bool:
        """Whether `ref` (a path, URI or Hub model) holds a checkpoint: one of the `markers` files
        (a model's `config.json`; stream heads' `pcg_streams.json`). A Hub model is asked for those
        files only (from the cache when offline).

        Raises:
            StorageError: a Hub model that cannot be had (the message says why and what to do).
        """
        hub = hub_ref(ref)
        if hub is not None:
            snapshot = hub_snapshot(hub, only=markers)
            return any((snapshot / m).is_file() for m in markers)
        return any(self.exists(join(os.fspath(ref), m)) for m in markers)
