"""The output lease (engine/io/lease.py) between real processes, without Ray: drivers starting at
the same instant end with exactly one holder, on a new output and when taking over a stale
lease; a frozen holder (SIGSTOP: alive, not renewing) is refused while its lease is fresh, taken
over once it is stale, and learns it lost the lease when it runs again; a holder of this machine
that was killed is taken over at once; one arriving while the holder writes its lease file is
told who holds it; on S3 (moto on 127.0.0.1) the lease is a conditional
create (`If-None-Match: *`). Fencing, locally and on S3: a displaced holder's writes are refused
and stay refused after its successor released the lease, a newer holder's commit record is
never replaced, S3's conditional writes fail once the object changed, and on a local disk a
takeover waits for the write an older holder checked for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine.config import StorageOptions
from engine.io.lease import Fence, Fenced, FencedStorage, LeaseHeld, OutputLease
from engine.io.storage import Storage

from jobhelpers import lease_released

ROOT = Path(__file__).resolve().parents[2]

# A driver standing in for `pcg-synth run` (the lease part of it): takes the lease at `start_at`
# (seconds since the epoch), says so on one line, holds it `hold_s` seconds, releases it. With
# hold_s < 0 it holds until it has lost the lease, and says why.
DRIVER = textwrap.dedent("""
    import json, sys, time
    from engine.io.lease import Fence, Fenced, FencedStorage, LeaseHeld, OutputLease
    from engine.io.storage import Storage
    root, job = sys.argv[1], sys.argv[5]
    stale_s, start_at, hold_s = (float(x) for x in sys.argv[2:5])
    notes = []
    lease = OutputLease(Storage(), root, stale_s, job=job, notify=notes.append)
    time.sleep(max(0.0, start_at - time.time()))
    try:
        lease.acquire()
    except LeaseHeld as exc:
        print(json.dumps({"refused": str(exc)}), flush=True)
        sys.exit(75)
    print(json.dumps({"held": lease.gen, "at": time.time(), "notes": notes}), flush=True)
    if hold_s >= 0:
        time.sleep(hold_s)
    else:
        while lease.lost is None:
            time.sleep(0.05)
        print(json.dumps({"lost": lease.lost}), flush=True)
    lease.release()
""")


def driver(root: Path, stale_s: float, start_at: float, hold_s: float, job: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(root), str(stale_s), str(start_at), str(hold_s), job],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def race(root: Path, n: int, stale_s: float = 30.0) -> tuple[list[dict], list[subprocess.Popen]]:
    """`n` drivers taking the lease at one instant (each holds it 1 s if it gets it)."""
    start_at = time.time() + 4.0  # every process has started (imported the engine) by then
    procs = [driver(root, stale_s, start_at, 1.0, f"d{i}") for i in range(n)]
    results = [first_line(p) for p in procs]
    for p in procs:
        p.wait(timeout=30)
    return results, procs


def test_drivers_starting_at_one_instant_end_with_exactly_one_holder(tmp_path):
    results, procs = race(tmp_path / "out", 6)
    held = [r for r in results if "held" in r]
    assert len(held) == 1 and held[0]["held"] == 1
    winner = procs[results.index(held[0])]
    refused = [r["refused"] for r in results if "refused" in r]
    assert len(refused) == 5 and [p.returncode for p in procs].count(75) == 5
    for text in refused:  # one line naming the holder: its job, host, pid, start time, the lease's age
        assert "\n" not in text and f"{tmp_path / 'out'} is in use by another driver: job '" in text
        assert f"(pid {winner.pid}, user " in text and ", started " in text and "lease renewed" in text
    assert lease_released(tmp_path / "out")  # at the end: its generation's file, marked released


def test_drivers_taking_over_a_stale_lease_at_one_instant_end_with_exactly_one_holder(tmp_path):
    """The lease's holder is frozen (SIGSTOP): alive, so only the stale time lets others in."""
    out = tmp_path / "out"
    frozen = driver(out, 3.0, 0, -1, "frozen")
    assert first_line(frozen)["held"] == 1
    frozen.send_signal(signal.SIGSTOP)
    try:
        results, procs = race(out, 5)  # they start 4 s later: the lease has gone 3 s unrenewed by then
    finally:
        frozen.send_signal(signal.SIGCONT)
    held = [r for r in results if "held" in r]
    assert len(held) == 1 and held[0]["held"] == 2  # the next generation, created by one of them
    assert len(held[0]["notes"]) == 1 and held[0]["notes"][0].startswith(f"took over the lease of {out} from job "
                                                                         f"'frozen' on host ")
    assert f"(pid {frozen.pid}, " in held[0]["notes"][0] and ", stale after 3.0 s" in held[0]["notes"][0]
    assert sum("refused" in r for r in results) == 4
    lost = first_line(frozen)  # running again: it finds it lost the lease, and stops writing
    assert "lost" in lost
    frozen.wait(timeout=30)


def test_a_frozen_holder_is_refused_while_fresh_taken_over_once_stale_and_learns_it(tmp_path):
    out = tmp_path / "out"
    holder = driver(out, 3.0, 0, -1, "first")
    started = first_line(holder)
    holder.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(LeaseHeld) as held:
            OutputLease(Storage(), str(out), 30.0, job="second").acquire()
        text = str(held.value)
        assert text.startswith(f"{out} is in use by another driver: job 'first' on host {os.uname().nodename} "
                               f"(pid {holder.pid}, user ")
        assert time.strftime("%Y-%m-%d %H:%M", time.localtime(started["at"])) in text
        assert text.endswith("rerun with --wait to wait for it (a lease not renewed for 3.0 s is taken over)")
        notes: list[str] = []
        second = OutputLease(Storage(), str(out), 30.0, job="second", wait=True, notify=notes.append)
        looks: list[str] = []  # what each of its looks at the lease found
        look = second.latest_readable

        def looked():
            holder = look()
            looks.append("held" if holder is not None and holder.holds else
                          "stale" if holder is not None and holder.stale else "other")
            return holder
        second.latest_readable = looked
        second.acquire()  # waits for the lease to go stale
        # it looked while the lease was held and kept waiting, and took it on its first stale look
        assert looks[0] == "held" and looks[-1] == "stale" and set(looks[:-1]) == {"held"}, looks
        assert notes[0].startswith(f"waiting for {out}: in use by job 'first' on host ")
        assert notes[-1].startswith(f"took over the lease of {out} from job 'first'")
    finally:
        holder.send_signal(signal.SIGCONT)
    lost = first_line(holder)["lost"]
    assert lost.startswith("could not renew the lease") or lost.startswith("the lease was taken over by job 'second'")
    holder.wait(timeout=30)
    assert second.lost is None and second.check() is None  # the old holder left the new one's lease alone
    second.release()


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path):
    out = tmp_path / "out"
    holder = driver(out, 600.0, 0, 600, "killed")
    first_line(holder)
    holder.kill()
    holder.wait()
    assert len(list((out / "_lease").iterdir())) == 1  # left behind, fresh (renewed within 600 s)
    notes: list[str] = []
    with OutputLease(Storage(), str(out), 600.0, job="rerun", notify=notes.append) as lease:
        assert lease.gen == 2 and [p.name for p in (out / "_lease").iterdir()] == ["0000000002.json"]
    assert len(notes) == 1 and notes[0].endswith(": its process is gone") and f"(pid {holder.pid}, " in notes[0]


def test_a_driver_refused_while_the_holder_writes_its_lease_file_is_told_who_holds_it(tmp_path):
    """The instant after a driver creates its lease file, the file is empty (being written and
    synced): a driver arriving then reads it again until it can say who holds the output."""
    import threading

    with OutputLease(Storage(), str(tmp_path / "elsewhere"), 60.0, job="the-holder") as real:
        body = real.body  # a live holder's record: this process
    lease_file = tmp_path / "out" / "_lease" / "0000000001.json"
    lease_file.parent.mkdir(parents=True)
    lease_file.write_bytes(b"")
    writer = threading.Timer(0.4, lease_file.write_bytes, args=(body,))
    writer.start()
    try:
        with pytest.raises(LeaseHeld) as refused:
            OutputLease(Storage(), str(tmp_path / "out"), 60.0, job="late").acquire()
    finally:
        writer.join()
    assert "is in use by another driver: job 'the-holder' on host " in str(refused.value)
    assert f"(pid {os.getpid()}, " in str(refused.value)


def test_the_lease_on_s3_is_a_conditional_create(s3_endpoint, s3_bucket):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint, region="us-east-1"))
    key = f"s3://{s3_bucket}/x"
    assert storage.create_new(key, b"first") and not storage.create_new(key, b"second")
    assert storage.read_bytes(key) == b"first"  # If-None-Match: * refused the second PUT
    root = f"s3://{s3_bucket}/out"
    first = OutputLease(storage, root, 2.0, job="first")
    first.acquire()
    with pytest.raises(LeaseHeld, match=f"{root} is in use by another driver: job 'first' on host "):
        OutputLease(storage, root, 2.0, job="second").acquire()
    first._stop.set()  # it stops renewing (a driver on a machine that was lost)
    first._thread.join()
    time.sleep(2.5)  # S3's modification times have whole seconds: well past 2 s
    notes: list[str] = []
    with OutputLease(storage, root, 30.0, job="second", notify=notes.append) as second:
        assert second.gen == 2 and storage.list(f"{root}/_lease") == [f"{root}/_lease/0000000002.json"]
        assert notes[0].startswith(f"took over the lease of {root} from job 'first'")
        assert first.check().startswith("the lease was taken over by job 'second'")
    left = f"{root}/_lease/0000000002.json"
    assert storage.list(root) == [left] and json.loads(storage.read_bytes(left))["released"]  # released, kept


def test_a_lease_on_an_fsspec_store(tmp_path):
    """fsspec's in-memory filesystem stands for gs:// and az:// (its create is exclusive)."""
    storage = Storage()
    with OutputLease(storage, "memory://lease-test/out", 5.0, job="one") as lease:
        held = lease.uri
        assert storage.list("memory://lease-test/out/_lease") == [held]
        with pytest.raises(LeaseHeld, match="memory://lease-test/out is in use by another driver: job 'one'"):
            OutputLease(storage, "memory://lease-test/out", 5.0, job="two").acquire()
    assert storage.list("memory://lease-test/out") == [held]  # marked released
    with OutputLease(storage, "memory://lease-test/out", 5.0, job="two") as lease:  # taken at once
        assert lease.gen == 2


# ---- fencing --------------------------------------------------------------------------------


def take_over(storage: Storage, root: str, first: OutputLease, job: str = "second") -> OutputLease:
    """A second driver takes `first`'s lease over once it stopped renewing (a frozen driver)."""
    first._stop.set()
    first._thread.join()
    time.sleep(2.5)  # past its 2 s stale time (S3's modification times have whole seconds)
    second = OutputLease(storage, root, 30.0, job=job, notify=lambda _: None)
    second.acquire()
    return second


@pytest.fixture(params=["local", "s3"])
def output_root(request, tmp_path):
    """An output on the local disk, or on S3 (moto on 127.0.0.1); yields (storage, root)."""
    if request.param == "local":
        return Storage(), str(tmp_path / "out")
    endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket")
    return Storage(StorageOptions(endpoint_url=endpoint, region="us-east-1")), f"s3://{bucket}/out"


def test_the_writes_of_a_displaced_holder_are_refused_and_stay_refused(output_root):
    storage, root = output_root
    first = OutputLease(storage, root, 2.0, job="first")
    first.acquire()
    old = FencedStorage(storage, first.fence)
    old.write_bytes(f"{root}/data/a.bin", b"first")
    old.write_commit(f"{root}/_commits/a.json", {"shard": "a"})
    assert json.loads(storage.read_bytes(f"{root}/_commits/a.json"))["lease_generation"] == 1
    second = take_over(storage, root, first)
    with pytest.raises(Fenced, match=f"{root} was taken over by job 'second' on host .* \\(lease generation 2; "
                                     "this driver's is 1\\): write refused"):
        old.write_bytes(f"{root}/data/a.bin", b"late")
    with pytest.raises(Fenced):
        old.write_commit(f"{root}/_commits/b.json", {"shard": "b"})
    new = FencedStorage(storage, second.fence)
    new.write_commit(f"{root}/_commits/a.json", {"shard": "a", "again": True})  # a newer holder redoes it
    second.release()
    with pytest.raises(Fenced, match="released .* ago"):  # its released record still fences the old holder
        old.write_bytes(f"{root}/data/a.bin", b"later")
    assert storage.read_bytes(f"{root}/data/a.bin") == b"first"
    assert not storage.exists(f"{root}/_commits/b.json")
    assert json.loads(storage.read_bytes(f"{root}/_commits/a.json"))["lease_generation"] == 2


def test_a_commit_record_of_a_newer_holder_is_never_replaced(output_root):
    """Even where the lease files say nothing newer (a check that passed just before a takeover),
    an older holder's commit record does not replace a newer holder's."""
    storage, root = output_root
    FencedStorage(storage, Fence(root, 3)).write_commit(f"{root}/_commits/a.json", {"shard": "a"})
    with pytest.raises(Fenced, match="lease generation 3; this driver's is 2"):
        FencedStorage(storage, Fence(root, 2)).write_commit(f"{root}/_commits/a.json", {"shard": "a"})
    assert json.loads(storage.read_bytes(f"{root}/_commits/a.json"))["lease_generation"] == 3


def test_a_conditional_write_on_s3_fails_once_the_object_changed(s3_endpoint, s3_bucket):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint, region="us-east-1"))
    uri = f"s3://{s3_bucket}/record.json"
    assert storage.read_versioned(uri) is None
    assert storage.write_if(uri, b"one", None) and not storage.write_if(uri, b"two", None)  # If-None-Match: *
    data, etag = storage.read_versioned(uri)
    storage.write_bytes(uri, b"changed meanwhile")
    assert not storage.write_if(uri, b"three", etag)  # If-Match: the version read
    assert storage.write_if(uri, b"four", storage.read_versioned(uri)[1])
    assert storage.read_bytes(uri) == b"four"


def test_on_a_local_disk_a_takeover_waits_for_the_write_an_older_holder_checked_for(tmp_path):
    """The check and the write are one step: a writer that passed its check finishes before the
    next generation's file exists; its next write is refused."""
    storage, root = Storage(), str(tmp_path / "out")
    first = OutputLease(storage, root, 60.0, job="first")
    first.acquire()
    first.release()  # its record stays: generation 1
    fence = Fence(root, 1)
    inside, wrote = threading.Event(), []

    def writer() -> None:
        with fence.guard(storage):
            inside.set()
            time.sleep(0.5)  # the takeover has started meanwhile (nothing is timed)
            storage.write_bytes(f"{root}/data/a.bin", b"first")
            wrote.append(storage.exists(f"{root}/_lease/0000000002.json"))  # the next generation, yet?

    thread = threading.Thread(target=writer)
    thread.start()
    inside.wait(5)
    second = OutputLease(storage, root, 60.0, job="second")
    second.acquire()
    thread.join()
    assert second.gen == 2 and wrote == [False]  # the takeover waited for the write in progress
    with pytest.raises(Fenced):
        FencedStorage(storage, fence).write_bytes(f"{root}/data/a.bin", b"late")
    second.release()
