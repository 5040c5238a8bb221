"""One output, one writer, end to end: real `pcg-synth run` processes (each on its own local Ray)
on the tiny kit. Two drivers started together on one output: one runs the job, the other
refuses in one line naming the holder, and a third started with `--wait` waits, then finds the
job finished and prints its summary; files and folders the job made follow the umask. A driver
killed holding the lease: the rerun takes the lease over and resumes to the codes of an
uninterrupted run (float64); one stopped by SIGTERM releases it. The output's filesystem full
mid-job (a real 8 MiB tmpfs, mounted by the test: it needs root, and is skipped without): one
line naming the file and the cause, the summary of what was committed, no traceback; after space
is freed the rerun completes with every row once. A job refused before any work leaves no
output folder."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.runtime.job import JobRunner

from jobhelpers import comparable, fill, job_spec, read_output, small_filesystem, texts, write_manifest

ROOT = Path(__file__).resolve().parents[2]
ROWS = 12
SHARDS = 6


def spec_file(kit_dir: Path, folder: Path, manifest: Path, output: Path) -> tuple[Path, object]:
    """A 12-row job of 6 shards on one worker holding one shard at a time, float64 (codes are
    batch-invariant), a 20 s stale time (a driver killed on this machine is taken over at once:
    its process is gone; test_lease.py takes over stale leases); a spec file for `pcg-synth run`."""
    spec = job_spec(kit_dir, [str(manifest)], str(output), models={"dtype": "float64"},
                    resources={"workers": 1, "rows_per_shard": 2, "shard_window": 1})
    spec = spec.model_copy(update={"output": spec.output.model_copy(update={"lease_stale_s": 20.0})})
    path = folder / f"{output.name}.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    return path, spec


def driver(spec: Path, *flags: str) -> subprocess.Popen:
    """`pcg-synth run SPEC` in a process group of its own (a kill takes its Ray along), under
    umask 022."""
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(spec), "--address", "local", *flags],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=0o022,
                            start_new_session=True)


def stop(*procs: subprocess.Popen) -> None:
    """End drivers a failed test left running, with their Ray (their process groups)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(check, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def commits(output: Path) -> list[Path]:
    folder = output / "_commits"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.fixture
def launch():
    """Starts drivers (`driver`); any still running when the test ends are killed with their Ray."""
    started: list[subprocess.Popen] = []

    def start(spec: Path, *flags: str) -> subprocess.Popen:
        started.append(driver(spec, *flags))
        return started[-1]

    yield start
    stop(*started)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return write_manifest(tmp_path_factory.mktemp("manifest") / "m.jsonl", texts(ROWS))


@pytest.fixture(scope="module")
def raced(kit_dir, manifest, tmp_path_factory):
    """Two drivers started together on one output, then a third with --wait once the lease is
    taken; returns (spec, {name: (returncode, stdout, stderr, pid)})."""
    folder = tmp_path_factory.mktemp("raced")
    path, spec = spec_file(kit_dir, folder, manifest, folder / "out")
    procs = {"a": driver(path), "b": driver(path)}
    try:
        wait_for(lambda: (folder / "out" / "_lease").is_dir(), procs["a"])
        procs["wait"] = driver(path, "--wait")
        done = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[name] = (proc.returncode, out, err, proc.pid)
    finally:
        stop(*procs.values())
    return spec, done


def test_two_drivers_on_one_output_one_runs_the_job_the_other_refuses_in_one_line(raced):
    spec, done = raced
    (winner,) = [done[n] for n in "ab" if done[n][0] == 0]
    (loser,) = [done[n] for n in "ab" if done[n][0] != 0]
    assert loser[0] == 75 and loser[1] == ""
    assert loser[2].count("\n") == 1 and "Traceback" not in loser[2]
    assert loser[2].startswith(f"error: {spec.output.uri} is in use by another driver: job 'test-job' on host "
                               f"{os.uname().nodename} (pid {winner[3]}, user ")
    assert ", started " in loser[2] and "lease renewed" in loser[2] and "rerun with --wait" in loser[2]
    rows = read_output(spec)
    assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
    summary = json.loads((Path(spec.output.uri) / "summary.json").read_text())
    assert summary["shards"]["run_now"] == summary["shards"]["total"] == SHARDS  # one driver decoded every shard


def test_a_driver_started_with_wait_waits_then_finds_the_job_finished(raced):
    spec, done = raced
    code, out, err, _ = done["wait"]
    assert code == 0 and "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"test-job: waiting for {spec.output.uri}: in use by job 'test-job' on host ")
    assert lines[1].startswith(f"test-job: {spec.output.uri} is free after ")
    assert "was committed before; nothing to run. The summary of the run that finished the job:" in out
    assert f"shards       {SHARDS}/{SHARDS} committed (0 before this run, 0 retries, 0 failed)" in out


def test_files_and_folders_of_a_job_follow_the_umask(raced):
    spec, _ = raced
    output = Path(spec.output.uri)
    modes = {str(p.relative_to(output)): p.stat().st_mode & 0o777 for p in output.rglob("*")}
    assert {name for name in modes if "/" not in name} == {"_commits", "data", "_job.json", "summary.json"}
    assert {m for name, m in modes.items() if (output / name).is_file()} == {0o644}  # umask 022
    assert {m for name, m in modes.items() if (output / name).is_dir()} | {output.stat().st_mode & 0o777} == {0o755}


def test_a_killed_drivers_lease_is_taken_over_and_the_job_resumes_identically(raced, kit_dir, manifest, tmp_path,
                                                                               launch):
    reference, _ = raced
    path, spec = spec_file(kit_dir, tmp_path, manifest, tmp_path / "out")
    output = tmp_path / "out"
    proc = launch(path)
    wait_for(lambda: len(commits(output)) >= 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    left = sorted((output / "_lease").iterdir())
    assert len(left) == 1 and json.loads(left[0].read_text())["pid"] == proc.pid  # never released
    kept = len(commits(output))
    assert 2 <= kept < SHARDS, "the kill must land mid-job"
    rerun = launch(path)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    notice = [line for line in err.splitlines() if "took over the lease" in line]
    assert len(notice) == 1 and f"(pid {proc.pid}, " in notice[0]
    assert notice[0].endswith(": its process is gone")
    summary = json.loads((output / "summary.json").read_text())
    assert summary["shards"]["committed_before"] >= kept and summary["shards"]["committed"] == SHARDS
    rows = read_output(spec)
    assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
    assert comparable(rows) == comparable(read_output(reference))
    assert not (output / "_lease").exists()


def test_a_terminated_driver_stops_in_one_line_and_releases_its_lease(kit_dir, manifest, tmp_path, launch):
    """SIGTERM (a scheduler stopping the driver, `kill`): it stops as on Ctrl-C, exit 143, one
    line, no traceback, its committed shards kept and its lease released, so a rerun from any
    machine starts at once (test_jobs.py resumes an interrupted job)."""
    path, spec = spec_file(kit_dir, tmp_path, manifest, tmp_path / "out")
    output = tmp_path / "out"
    proc = launch(path)
    wait_for(lambda: len(commits(output)) >= 2, proc)
    proc.send_signal(signal.SIGTERM)  # the driver alone, as a scheduler's stop does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("terminated")] == [
        "terminated (SIGTERM): committed shards are kept; rerun the same command to resume"]
    assert 2 <= len(commits(output)) < SHARDS, "the signal must land mid-job"
    assert not (output / "_lease").exists()


def test_a_full_output_filesystem_ends_in_one_line_and_the_rerun_completes(raced, kit_dir, manifest, tmp_path,
                                                                           launch):
    """A real full disk: the output on a tmpfs that the test fills after the first commit."""
    reference, _ = raced
    with small_filesystem(tmp_path / "disk") as disk:
        output = disk / "out"
        path, spec = spec_file(kit_dir, tmp_path, manifest, output)
        proc = launch(path)
        wait_for(lambda: len(commits(output)) >= 1, proc)
        filler = fill(disk)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1 and "Traceback" not in err
        line = err.strip().splitlines()[-1]
        kept = len(commits(output))
        assert 1 <= kept < SHARDS
        assert line.startswith(f"error: cannot write {output}/")
        assert (f": No space left on device; the job stopped with {kept} of {SHARDS} shards committed (kept); "
                "summary.json not written (cannot write " in line)
        assert line.endswith(f"free space on its filesystem, then rerun: pcg-synth run {path} --address local")
        summary = json.loads(out[: out.index("\njob ")])  # printed, as it could not be written
        assert summary["shards"]["committed"] == kept and summary["shards"]["failed"] == SHARDS - kept
        assert f"shards       {kept}/{SHARDS} committed" in out  # and the table
        assert not (output / "summary.json").exists() and not list(output.rglob(".*.tmp"))
        filler.unlink()
        rerun = launch(path)
        out, err = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, err
        summary = json.loads((output / "summary.json").read_text())
        assert summary["shards"]["committed_before"] == kept and summary["shards"]["committed"] == SHARDS
        rows = read_output(spec)
        assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
        assert comparable(rows) == comparable(read_output(reference))


def test_a_job_refused_before_any_work_leaves_no_output_folder(kit_dir, tmp_path):
    empty = write_manifest(tmp_path / "empty.jsonl", [])
    out = tmp_path / "runs" / "out"
    with pytest.raises(ValueError, match=rf"^input.manifests: no rows in the 1 manifest file read \({empty}\)$"):
        JobRunner(job_spec(kit_dir, [str(empty)], str(out)), progress=False).run()
    with pytest.raises(ValueError, match=r"input.manifests\[0\]: no manifest files"):
        JobRunner(job_spec(kit_dir, [str(tmp_path / "missing.jsonl")], str(out)), progress=False).run()
    assert not (tmp_path / "runs").exists()  # nor the folder above it, made for it
