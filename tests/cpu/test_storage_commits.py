"""What a local commit guarantees (engine/io/files.py): every file is fsynced before the rename
that publishes it and its folder after (checked by recording os.open / os.fsync / os.replace as
the writes run, not by pulling the power), new folders are made durable in their parents, files
and folders follow the umask, and a write to a full filesystem (a real tmpfs, filled; root only)
fails in one line naming the file and the cause, leaving nothing behind."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from engine.io.dataset import write_parquet
from engine.io.storage import Storage, WriteFailed

from jobhelpers import fill, small_filesystem


@pytest.fixture
def recorded(monkeypatch):
    """Every os.open (its path), os.fsync (the path its descriptor was opened on) and os.replace,
    in order."""
    events: list[tuple] = []
    paths: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def opened(path, flags, mode=0o777, **kw):
        fd = real_open(path, flags, mode, **kw)
        paths[fd] = os.fspath(path)
        return fd

    def fsync(fd):
        events.append(("fsync", paths.get(fd)))
        real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_every_local_commit_is_fsynced_before_its_rename_and_its_folder_after(tmp_path, recorded):
    storage = Storage()
    shard = tmp_path / "out" / "data" / "shard-00000.parquet"
    storage.write_bytes(str(shard), b"rows")  # new folders, then a file
    storage.write_bytes(str(shard), b"rows again")  # an overwrite
    write_parquet(pa.table({"x": [1, 2]}), tmp_path / "out" / "table.parquet")  # written by pyarrow
    assert storage.create_new(str(tmp_path / "out" / "_lease" / "0000000001.json"), b"{}")  # no rename
    renames = [(i, e) for i, e in enumerate(recorded) if e[0] == "replace"]
    assert len(renames) == 3
    for n, (i, (_, src, dst)) in enumerate(renames):
        assert ("fsync", src) in recorded[:i], f"{src} renamed before it was fsynced"
        until = renames[n + 1][0] if n + 1 < len(renames) else len(recorded)
        assert ("fsync", str(Path(dst).parent)) in recorded[i:until], f"{dst}'s folder not fsynced after the rename"
    # each new folder is made durable in its parent; the exclusive create fsyncs the file and its folder
    for folder in (tmp_path / "out", tmp_path / "out" / "data", tmp_path / "out" / "_lease"):
        assert ("fsync", str(folder.parent)) in recorded
    assert recorded[-2:] == [("fsync", str(tmp_path / "out" / "_lease" / "0000000001.json")),
                             ("fsync", str(tmp_path / "out" / "_lease"))]


@pytest.mark.parametrize("umask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_files_and_folders_follow_the_umask(tmp_path, umask, file_mode, folder_mode):
    storage = Storage()
    before = os.umask(umask)
    try:
        storage.write_bytes(str(tmp_path / "out" / "data" / "a.parquet"), b"a")
        storage.create_new(str(tmp_path / "out" / "_lease" / "1.json"), b"{}")
        write_parquet(pa.table({"x": [1]}), tmp_path / "out" / "t.parquet")
    finally:
        os.umask(before)
    out = tmp_path / "out"
    assert {p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()} == {file_mode}
    assert {p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")] if p.is_dir()} == {folder_mode}


def test_a_write_to_a_full_filesystem_names_the_file_and_the_cause(tmp_path):
    storage = Storage()
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        storage.write_bytes(str(disk / "out" / "first.json"), b"{}")
        fill(disk)
        target = disk / "out" / "shard.parquet"
        with pytest.raises(WriteFailed) as failed:
            storage.write_bytes(str(target), b"x" * 100_000)
        assert str(failed.value) == f"cannot write {target}: No space left on device"
        assert failed.value.remedy == "free space on its filesystem"
        assert sorted(p.name for p in (disk / "out").iterdir()) == ["first.json"]  # no temporary left
        again = pickle.loads(pickle.dumps(failed.value))  # as it reaches the driver from a worker
        assert (type(again), str(again), again.remedy) == (WriteFailed, str(failed.value), failed.value.remedy)


def test_a_write_refused_for_permission_says_so(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o555)
    with pytest.raises(WriteFailed, match=f"^cannot write {folder}/x: Permission denied$"):
        Storage().write_bytes(str(folder / "x"), b"1")
