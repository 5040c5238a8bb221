"""One writer per output: the lease a job's driver holds on its output while it runs.

The lease is a small JSON file under `<output>/_lease/`, named by a generation number
(`0000000001.json`, ...), saying who holds it (host, pid, user, start time, the job) and how
long it may go unrenewed before another driver may take it over (`stale_s`, the holder's own).
A driver takes the lease by creating the next generation's file with a create that fails when
the file exists (`Storage.create_new`: O_CREAT | O_EXCL locally, `If-None-Match: *` on S3):
of several drivers creating the same generation at once exactly one succeeds, whether the
output is new (generation 1) or its lease is being taken over (the next one), so no lease is
ever deleted to be taken. The holder renews its file every quarter of `stale_s`; a lease is
taken over when it has gone unrenewed for the holder's `stale_s`, or at once when its holder
was a process of this machine that is gone (killed, crashed). A holder that finds a later
generation, or its own file replaced or removed, or that could not renew for three quarters of
`stale_s`, has lost the lease (`OutputLease.lost`) and must stop writing.

Ages compare the reader's clock with the file's modification time (the local clock, a shared
filesystem's server or the object store): machines sharing an output need clocks in step (NTP)
to well within `stale_s`.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.io.storage import Storage, StorageError, join

FOLDER = "_lease"
WAIT_NOTE_S = 60.0  # while waiting (--wait), a line this often says it still waits
BEING_WRITTEN_S = 2.0  # how long a fresh lease file may stay empty before it is called unreadable
LEASE_EXIT_CODE = 75  # EX_TEMPFAIL: try again later (the output is in use)


class LeaseHeld(StorageError):
    """Another driver holds the output's lease (and waiting was not asked for)."""


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

    def describe(self, now: float) -> str:
        r = self.record
        if not r.get("pid"):
            return f"a driver whose lease file {self.uri} is unreadable or still being written ({span(self.age_s)} old)"
        started = float(r.get("started", now))
        job = f"job {r['job']!r} " if r.get("job") else ""
        return (f"{job}on host {r.get('host')} (pid {r['pid']}, user {r.get('user')}), started "
                f"{clock_time(started)} ({span(now - started)} ago), lease renewed {span(self.age_s)} ago")


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
        self.uri: str | None = None
        self.gen = 0
        self.body = b""
        self._lost: str | None = None
        self._last_ok = 0.0  # time.monotonic() of the last successful renewal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> OutputLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- reading ----------------------------------------------------------------------------

    def generations(self) -> list[tuple[int, str]]:
        """(generation, URI) of the lease files there, oldest first."""
        out = []
        for uri in self.storage.list(self.folder):
            name = uri.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append((int(name[:-5]), uri))
        return sorted(out)

    def read(self, gen: int, uri: str) -> Holder | None:
        when = self.storage.modified(uri)
        if when is None:
            return None  # released or cleaned up meanwhile
        try:
            record = json.loads(self.storage.read_bytes(uri))
        except (StorageError, ValueError):
            record = {}
        return Holder(uri, gen, record if isinstance(record, dict) else {}, max(0.0, time.time() - when),
                      self.stale_s)

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
            gone = holder is not None and not holder.stale and process_gone(holder.record)
            if holder is None or holder.stale or gone:
                if self.create(holder.gen + 1 if holder else 1):
                    if holder is not None:
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
        if not self.storage.create_new(uri, body):
            return False
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

    # ---- letting it go ----------------------------------------------------------------------

    def give_up(self) -> None:
        """Delete this driver's lease file if it still holds this driver's token."""
        try:
            if json.loads(self.storage.read_bytes(self.uri)).get("token") == self.token:
                self.storage.delete(self.uri)
        except (StorageError, ValueError):
            pass  # gone already, or unreachable: it goes stale
        self.uri = None

    def release(self) -> None:
        """Stop renewing and delete this driver's lease file (a lease it lost is left alone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.uri is not None:
            self.give_up()
            self.storage.remove_empty_folders(self.folder)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "?"
