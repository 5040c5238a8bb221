"""One writer per output: the lease a job's driver holds on its output while it runs.

The lease is a small JSON file under `<output>/_lease/`, named by a generation number
(`0000000001.json`, ...), saying who holds it (host, pid, user, start time, the job) and how
long it may go unrenewed before another driver may take it over (`stale_s`, the holder's own).
A driver takes the lease by creating the next generation's file with a create that fails when
the file exists (`Storage.create_new`: O_CREAT | O_EXCL locally, `If-None-Match: *` on S3):
of several drivers creating the same generation at once exactly one succeeds, whether the
output is new (generation 1) or its lease is being taken over (the next one), so no lease is
ever deleted to be taken, and a driver that ends marks its file released rather than deleting
it (the newest generation stays: the next driver takes the lease at once). The holder renews
its file every quarter of `stale_s`; a lease is taken over when it has gone unrenewed for the
holder's `stale_s`, or at once when its holder was a process of this machine that is gone
(killed, crashed). A holder that finds a later
generation, or its own file replaced or removed, or that could not renew for three quarters of
`stale_s`, has lost the lease (`OutputLease.lost`) and must stop writing.

The generation is the lease's fencing token: it only grows with each new holder. Every write a
job makes to its output goes through a `FencedStorage` of its holder's generation (the driver's
and its workers'), which refuses it (`Fenced`) once a newer generation's file exists, so a
driver that lost its lease (stopped, cut off) cannot have its workers write over its successor:

- on one machine's filesystem (the output on a local disk) the check and the write are one step:
  writers hold a shared lock on a lock file of this machine while they check and write, a
  driver taking the lease holds it exclusively while it creates its generation's file, so no
  write of an older holder starts after a newer generation exists;
- elsewhere (an object store, a filesystem shared by several machines) each write is checked
  just before it is made: a write that passed its check can still land up to one request's time
  after a takeover. Commit records are written conditionally where the store allows it (S3:
  `If-Match` on the record read, `If-None-Match: *` on a new one), so a commit record of a newer
  holder is never replaced by an older holder's.

Ages compare the reader's clock with the file's modification time (the local clock, a shared
filesystem's server or the object store): machines sharing an output need clocks in step (NTP)
to well within `stale_s`.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.io.storage import Storage, StorageError, join, parse

FOLDER = "_lease"
WAIT_NOTE_S = 60.0  # while waiting (--wait), a line this often says it still waits
BEING_WRITTEN_S = 2.0  # how long a fresh lease file may stay empty before it is called unreadable
LEASE_EXIT_CODE = 75  # EX_TEMPFAIL: try again later (the output is in use)


class LeaseHeld(StorageError):
    """Another driver holds the output's lease (and waiting was not asked for)."""


class Fenced(StorageError):
    """A write refused because a newer holder has taken the output's lease over (`Fence`).

    Attributes:
        generation: the refused writer's lease generation.
        newer: the generation that holds the output now.
        holder: who holds it (`Holder.describe`).
    """

    def __init__(self, root: str, generation: int, newer: int, holder: str) -> None:
        super().__init__(f"{root} was taken over by {holder} (lease generation {newer}; this driver's is "
                         f"{generation}): write refused")
        self.root, self.generation, self.newer, self.holder = root, generation, newer, holder

    def __reduce__(self):  # crosses process boundaries (Ray) with its fields
        return type(self), (self.root, self.generation, self.newer, self.holder)


def span(seconds: float) -> str:
    """`4.2 s`, `42 s`, `3 min 12 s`, `2 h 5 min`."""
    if seconds < 10:
        return f"{max(seconds, 0):.1f} s"
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def clock_time(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix))


# ---- which process holds it -------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def process_identity(pid: int | str = "self") -> dict:
    """Where a pid means something: this boot of the kernel and this pid namespace (Linux), and
    the process's start time (a pid reused by another process differs in it). Empty elsewhere."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    stat = _read(f"/proc/{pid}/stat")
    try:
        pid_ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        pid_ns = None
    if not (boot and stat and pid_ns):
        return {}
    return {"boot_id": boot, "pid_ns": pid_ns, "proc_start": stat[stat.rindex(")") + 2:].split()[19]}


def process_gone(record: dict) -> bool:
    """Whether the lease's holder is a process of this machine (same kernel boot, same pid
    namespace) that no longer runs: exited, killed, a zombie, or its pid now another process's."""
    mine = process_identity()
    if not mine or not record.get("pid") or any(record.get(k) != mine[k] for k in ("boot_id", "pid_ns")):
        return False  # another machine or container: only the stale time tells
    stat = _read(f"/proc/{int(record['pid'])}/stat")
    if stat is None:
        return True
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] in ("Z", "X") or fields[19] != record.get("proc_start")


@dataclass
class Holder:
    """A lease file as a reader finds it."""

    uri: str
    gen: int
    record: dict  # empty while its creator is still writing it (or if it is unreadable)
    age_s: float  # since its last renewal
    default_stale_s: float

    @property
    def stale_s(self) -> float:
        """The holder's own stale time (it renews within a quarter of it)."""
        return float(self.record.get("stale_s") or self.default_stale_s)

    @property
    def stale(self) -> bool:
        return self.age_s > self.stale_s

    @property
    def released(self) -> bool:
        """Its driver ended and let the lease go (the file stays: its generation fences)."""
        return bool(self.record.get("released"))

    @property
    def gone(self) -> bool:
        """Its driver, a process of this machine, no longer runs (while its lease is fresh)."""
        return not self.stale and not self.released and process_gone(self.record)

    @property
    def holds(self) -> bool:
        """Whether its driver still holds the lease: not released, not stale, not gone."""
        return not (self.released or self.stale or self.gone)

    def describe(self, now: float) -> str:
        r = self.record
        if not r.get("pid"):
            return f"a driver whose lease file {self.uri} is unreadable or still being written ({span(self.age_s)} old)"
        started = float(r.get("started", now))
        job = f"job {r['job']!r} " if r.get("job") else ""
        last = (f"released {span(now - float(r['released']))} ago" if r.get("released")
                else f"lease renewed {span(self.age_s)} ago")
        return (f"{job}on host {r.get('host')} (pid {r['pid']}, user {r.get('user')}), started "
                f"{clock_time(started)} ({span(now - started)} ago), {last}")


def generations(storage: Storage, folder: str) -> list[tuple[int, str]]:
    """(generation, URI) of the lease files in `folder`, oldest first."""
    out = []
    for uri in storage.list(folder):
        name = uri.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit():
            out.append((int(name[:-5]), uri))
    return sorted(out)


def read_holder(storage: Storage, gen: int, uri: str, default_stale_s: float) -> Holder | None:
    """The lease file `uri` as found now, or None if it is gone."""
    when = storage.modified(uri)
    if when is None:
        return None  # released or cleaned up meanwhile
    try:
        record = json.loads(storage.read_bytes(uri))
    except (StorageError, ValueError):
        record = {}
    return Holder(uri, gen, record if isinstance(record, dict) else {}, max(0.0, time.time() - when),
                  default_stale_s)


# ---- fencing ----------------------------------------------------------------------------------

TAKEOVER_LOCK_WAIT_S = 30.0  # longest a driver taking the lease waits for writers still writing


def lock_file(root: str) -> Path | None:
    """This machine's lock file for the output `root` on a local filesystem (None elsewhere): in
    the temporary folder, not in the output, which it must not change."""
    if parse(root).scheme != "file":
        return None
    digest = hashlib.sha1(parse(root).path.encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"pcg-synth-fence-{digest}.lock"


@contextmanager
def locked(root: str, exclusive: bool, wait_s: float | None = None) -> Iterator[bool]:
    """Hold the output's lock (`lock_file`): shared by writers, exclusive by a driver taking the
    lease; yields whether it is held (False: not a local output, or `wait_s` passed first)."""
    import fcntl

    path = lock_file(root)
    if path is None:
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, mode | (fcntl.LOCK_NB if deadline is not None else 0))
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    held = False
                    break
                time.sleep(0.02)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Fence:
    """A lease holder's fencing token: the output and the holder's generation. Workers receive it
    with each shard; every write checks it (`FencedStorage`)."""

    root: str
    generation: int

    @property
    def folder(self) -> str:
        return join(self.root, FOLDER)

    def check(self, storage: Storage) -> None:
        """Raises `Fenced` if a newer generation's lease file exists."""
        newer = [(g, u) for g, u in generations(storage, self.folder) if g > self.generation]
        if newer:
            gen, uri = newer[-1]
            holder = read_holder(storage, gen, uri, 0.0)
            who = holder.describe(time.time()) if holder is not None else f"a driver (lease file {uri})"
            raise Fenced(self.root, self.generation, gen, who)

    @contextmanager
    def guard(self, storage: Storage) -> Iterator[None]:
        """Check, then write inside: on a local output under the shared lock (no takeover can
        complete in between), elsewhere right after the check."""
        with locked(self.root, exclusive=False):
            self.check(storage)
            yield


class FencedStorage:
    """`storage` whose writes (`write_bytes`, `create_new`, `delete`) are made only while
    `fence` holds the output (`Fence.guard`); reads and everything else pass through."""

    def __init__(self, storage: Storage, fence: Fence) -> None:
        self.storage, self.fence = storage, fence

    def __getattr__(self, name: str):
        return getattr(self.storage, name)

    def write_bytes(self, uri: str, data: bytes) -> None:
        with self.fence.guard(self.storage):
            self.storage.write_bytes(uri, data)

    def create_new(self, uri: str, data: bytes) -> bool:
        with self.fence.guard(self.storage):
            return self.storage.create_new(uri, data)

    def delete(self, uri: str) -> None:
        with self.fence.guard(self.storage):
            self.storage.delete(uri)

    def write_commit(self, uri: str, record: dict) -> None:
        """Write a commit record naming this writer's generation (`lease_generation`), never over
        a newer holder's record: under the lock locally, a conditional write on S3 (the record
        read and replaced only if unchanged, or created only if absent), check-then-write on
        other stores.

        Raises:
            Fenced: a newer holder exists, or wrote this record.
        """
        body = json.dumps({**record, "lease_generation": self.fence.generation}, indent=1).encode()
        while True:
            with self.fence.guard(self.storage):
                found = self.storage.read_versioned(uri)
                if found is not None:
                    try:
                        theirs = int(json.loads(found[0]).get("lease_generation") or 0)
                    except (ValueError, AttributeError):
                        theirs = 0
                    if theirs > self.fence.generation:
                        raise Fenced(self.fence.root, self.fence.generation, theirs,
                                     f"the holder that committed {uri}")
                if self.storage.write_if(uri, body, found[1] if found is not None else None):
                    return
            # the record changed between the read and the write: read it again


# ---- the lease --------------------------------------------------------------------------------


class OutputLease:
    """The lease on one output, for the driver writing it; a context manager (acquire, renew in
    the background, release at the end, also on an error or Ctrl-C).

    Args:
        storage: the output's storage.
        root: the output's URI.
        stale_s: how long this driver's lease may go unrenewed before another driver may take
            it over (renewed every quarter of it); also the stale time assumed for a lease file
            that does not say its own.
        job: the job's name, shown to other drivers.
        wait: wait for a held lease to be released or to go stale instead of refusing.
        notify: where notices go (a takeover, waiting); default: stderr.
    """

    def __init__(self, storage: Storage, root: str, stale_s: float = 60.0, job: str = "", wait: bool = False,
                 notify: Callable[[str], None] | None = None) -> None:
        self.storage, self.root, self.stale_s, self.job, self.wait = storage, root, stale_s, job, wait
        self.folder = join(root, FOLDER)
        self.notify = notify or (lambda text: print(text, file=sys.stderr, flush=True))
        self.token = uuid.uuid4().hex
        self.keep_record = True  # on release: mark the lease file released (off: delete it)
        self.uri: str | None = None
        self.gen = 0
        self.body = b""
        self._lost: str | None = None
        self._last_ok = 0.0  # time.monotonic() of the last successful renewal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> OutputLease:
        try:
            self.acquire()
        except BaseException:  # refused (in use, a full disk, Ctrl-C): no empty lease folder left
            self.storage.remove_empty_folders(self.folder)
            raise
        return self

    @property
    def fence(self) -> Fence:
        """This holder's fencing token (`Fence`): what its writes are checked against."""
        return Fence(self.root, self.gen)

    def __exit__(self, *exc) -> None:
        self.release(self.keep_record)

    # ---- reading ----------------------------------------------------------------------------

    def generations(self) -> list[tuple[int, str]]:
        """(generation, URI) of the lease files there, oldest first."""
        return generations(self.storage, self.folder)

    def read(self, gen: int, uri: str) -> Holder | None:
        return read_holder(self.storage, gen, uri, self.stale_s)

    def latest(self) -> Holder | None:
        """The newest lease file (its holder holds the lease unless it is stale), or None."""
        for gen, uri in reversed(self.generations()):
            holder = self.read(gen, uri)
            if holder is not None:
                return holder
        return None

    def latest_readable(self) -> Holder | None:
        """`latest`, read again for up to `BEING_WRITTEN_S` while its file is empty or unreadable
        and fresh: a driver that has just created it is still writing it (and syncing it to disk),
        and the driver refused should be told who holds the output."""
        holder = self.latest()
        deadline = time.monotonic() + BEING_WRITTEN_S
        while holder is not None and not holder.record.get("pid") and not holder.stale and time.monotonic() < deadline:
            time.sleep(0.05)
            holder = self.latest()
        return holder

    # ---- taking it --------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease, taking over a stale one, or one whose holder on this machine is gone.

        Raises:
            LeaseHeld: another driver holds it and `wait` is off.
        """
        waited_since = noted = None
        while True:
            holder = self.latest_readable()
            gone = holder is not None and holder.gone  # read once: it looks at /proc
            if holder is None or holder.released or holder.stale or gone:
                if self.create(holder.gen + 1 if holder else 1):
                    if holder is not None and not holder.released:
                        why = ("its process is gone" if gone else
                               f"not renewed for {span(holder.age_s)}, stale after {span(holder.stale_s)}")
                        self.notify(f"took over the lease of {self.root} from {holder.describe(time.time())}: {why}")
                    elif waited_since is not None:
                        self.notify(f"{self.root} is free after {span(time.monotonic() - waited_since)} of waiting")
                    self.cleanup()
                    self.start_renewing()
                    return
                continue  # another driver created that generation first: look again
            now = time.time()
            if not self.wait:
                raise LeaseHeld(f"{self.root} is in use by another driver: {holder.describe(now)}; rerun with "
                                f"--wait to wait for it (a lease not renewed for {span(holder.stale_s)} is taken over)")
            if waited_since is None:
                waited_since = noted = time.monotonic()
                self.notify(f"waiting for {self.root}: in use by {holder.describe(now)} (--wait; Ctrl-C stops waiting)")
            elif time.monotonic() - noted >= WAIT_NOTE_S:
                noted = time.monotonic()
                self.notify(f"still waiting for {self.root} ({span(noted - waited_since)} so far): "
                            f"lease renewed {span(holder.age_s)} ago")
            time.sleep(min(max(holder.stale_s / 4, 0.2), 5.0))

    def create(self, gen: int) -> bool:
        """Create generation `gen`'s file for this driver; True if this driver then holds the
        lease (the create succeeded, the file holds this driver's token, no later generation
        exists: a slower driver may create a generation already taken over and cleaned up)."""
        record = {"job": self.job, "host": socket.gethostname(), "pid": os.getpid(), "user": _user(),
                  "started": time.time(), "stale_s": self.stale_s, "token": self.token, "generation": gen,
                  **process_identity()}
        body = json.dumps(record, indent=1).encode()
        uri = join(self.folder, f"{gen:010d}.json")
        # exclusive: writers of an older generation finish the write they checked for first
        with locked(self.root, exclusive=True, wait_s=TAKEOVER_LOCK_WAIT_S) as held:
            if not self.storage.create_new(uri, body):
                return False
        if not held and lock_file(self.root) is not None:
            self.notify(f"a writer of an earlier holder kept {self.root} locked for {span(TAKEOVER_LOCK_WAIT_S)}: "
                        "taking the lease without waiting longer (its next write is refused)")
        self.uri, self.gen, self.body = uri, gen, body
        if self.check() is not None:
            self.give_up()
            return False
        self._last_ok = time.monotonic()
        return True

    def cleanup(self) -> None:
        """Remove the older generations' files (best effort: a leftover is never the newest)."""
        for gen, uri in self.generations():
            if gen < self.gen:
                try:
                    self.storage.delete(uri)
                except StorageError:
                    pass

    # ---- holding it -------------------------------------------------------------------------

    def check(self) -> str | None:
        """Why this driver no longer holds the lease, or None if it does."""
        later = [(g, u) for g, u in self.generations() if g > self.gen]
        for gen, uri in reversed(later):
            holder = self.read(gen, uri)
            if holder is not None:
                return f"the lease was taken over by {holder.describe(time.time())}"
        try:
            record = json.loads(self.storage.read_bytes(self.uri))
        except ValueError:
            record = {}
        except StorageError:
            if self.storage.exists(self.uri):
                raise
            return f"its lease file {self.uri} was removed"
        if not isinstance(record, dict) or record.get("token") != self.token:
            return f"its lease file {self.uri} now belongs to another driver"
        return None

    def renew(self) -> None:
        why = self.check()
        if why is None and not self.storage.refresh(self.uri, self.body):
            why = f"its lease file {self.uri} was removed"
        if why is not None:
            self._lost = why
        else:
            self._last_ok = time.monotonic()

    def start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="output-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while self._lost is None and not self._stop.wait(self.stale_s / 4):
            try:
                self.renew()
            except StorageError:  # retried inside; `lost` says when too long has passed
                continue

    @property
    def lost(self) -> str | None:
        """Why this driver must stop writing (its lease was taken over, or it could not renew it
        for three quarters of the stale time), or None while it holds the lease."""
        if self._lost is not None or self.uri is None:
            return self._lost
        unrenewed = time.monotonic() - self._last_ok
        if unrenewed > 0.75 * self.stale_s:
            return f"could not renew the lease for {span(unrenewed)} (stale after {span(self.stale_s)})"
        return None

    def taken_over(self) -> str:
        """Why this driver no longer holds the lease, naming the driver that took it over where
        one did (a driver that could not renew in time may find it has)."""
        try:
            why = self.check() if self.uri is not None else None
        except StorageError:
            why = None
        return why or self.lost or "its lease was taken over"

    # ---- letting it go ----------------------------------------------------------------------

    def give_up(self, keep_record: bool = False) -> None:
        """Let go of this driver's lease file if it still holds this driver's token: mark it
        released (`keep_record`: the newest generation stays, so the fence of every older holder
        keeps refusing its writes, and the next driver takes the lease at once), else delete it
        (where the record cannot be written, as on a full disk, too)."""
        try:
            record = json.loads(self.storage.read_bytes(self.uri))
            if record.get("token") == self.token:
                if keep_record:
                    try:
                        self.storage.write_bytes(self.uri, json.dumps({**record, "released": time.time()},
                                                                      indent=1).encode())
                        self.uri = None
                        return
                    except StorageError:
                        pass
                self.storage.delete(self.uri)
        except (StorageError, ValueError):
            pass  # gone already, or unreachable: it goes stale
        self.uri = None

    def release(self, keep_record: bool = True) -> None:
        """Stop renewing and let go of this driver's lease file (`give_up`: kept, marked released,
        unless `keep_record` is off: a driver refused before any work on an output it created
        leaves nothing there); a lease it lost is left alone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.uri is not None:
            self.give_up(keep_record)
            self.storage.remove_empty_folders(self.folder)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "?"
