"""Local files written so that a commit survives a crash: the data reaches the disk (fsync)
before the rename that publishes it, and the rename reaches the disk (fsync of the folder)
before the write returns. Files and folders take their mode from the process umask (0644 and
0755 under the usual 022), as ordinary files do.

What a failed local write means is decided here too: `remedy` tells a full disk, a quota, a
read-only filesystem or a denied permission (retrying soon will not help) from a passing error.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

# a write that retrying will not cure soon (no space, quota, too big, read-only, denied): what to do
REMEDIES = {errno.ENOSPC: "free space on its filesystem", errno.EDQUOT: "free space or raise the quota",
            errno.EFBIG: "the file is larger than its filesystem allows: write the output elsewhere",
            errno.EROFS: "make its filesystem writable", errno.EACCES: "give this user write access there",
            errno.EPERM: "give this user write access there"}
# what fsync of a folder may answer on filesystems that do not support it (nothing to make durable)
NO_DIR_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def remedy(exc: OSError) -> str | None:
    """What to do about a failed local write that will fail again if retried soon (disk full,
    quota, read-only, permission); None for a passing error."""
    return REMEDIES.get(exc.errno)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make the entries of `folder` (a rename, a new file) durable; a no-op where the filesystem
    cannot fsync a folder."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def make_dirs(folder: str | os.PathLike) -> list[Path]:
    """Create `folder` and its missing parents (mode 0777 less the umask), each new folder made
    durable in its parent; returns the folders created, outermost first."""
    missing = []
    path = Path(folder)
    while not path.exists():
        missing.append(path)
        path = path.parent
    made = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:  # another process made it meanwhile
            continue
        fsync_dir(path.parent)
        made.append(path)
    return made


def create_new(path: str | os.PathLike, data: bytes) -> bool:
    """Create `path` holding `data` if no file of that name exists (O_CREAT | O_EXCL: of several
    processes creating it at once, exactly one succeeds); durable when it returns True.

    For an instant after creation the file exists but is empty: a reader must take an empty or
    unreadable file as one being written.

    Returns:
        False when `path` exists already.
    """
    target = Path(path)
    for _ in range(3):  # the folder may be removed between make_dirs and open (a released lease)
        make_dirs(target.parent)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        except FileNotFoundError:
            continue
        break
    else:
        raise FileNotFoundError(errno.ENOENT, "its folder keeps vanishing", str(target.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return True


def temporary_beside(target: Path) -> tuple[int, Path]:
    """A new hidden file next to `target` (listings skip names starting with '.'), opened for
    writing, its mode 0666 less the umask (mkstemp would make it 0600)."""
    while True:
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def publish(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename a finished temporary file (fsynced by its writer) over `target` and make the
    rename durable: after this returns, a crash leaves `target` whole, never empty or short."""
    os.replace(tmp, target)
    fsync_dir(Path(target).parent)


def sync_file(path: str | os.PathLike) -> None:
    """fsync a file written by another library (pyarrow), before `publish` renames it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a local file via a temporary sibling, fsynced, renamed into place, the folder
    fsynced: readers never see half a file, and a crash after this returns keeps all of it."""
    target = Path(path)
    make_dirs(target.parent)
    fd, tmp = temporary_beside(target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_empty_dirs(folder: str | os.PathLike) -> None:
    """Remove `folder` and the folders under it if none holds a file (a refused job's output
    folder); anything holding a file is left as it is."""
    root = Path(folder)
    if not root.is_dir():
        return
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            return
    try:
        root.rmdir()
    except OSError:
        pass
