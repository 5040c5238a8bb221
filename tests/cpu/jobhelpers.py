"""Helpers shared by the job tests: specs over the kit, reading a job's output, a small real
filesystem to fill, NeMo's manifests read as NeMo reads them, a text of two minutes' speech."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import soundfile as sf

from engine.config import JobSpec
from engine.io.storage import Storage

# three paragraphs, about two minutes of speech (1,812 characters): sentences, clauses, abbreviations
PARAGRAPHS = [
    "The harbour was quiet before dawn. Fishing boats rocked at their moorings, and the gulls had not "
    "yet begun their morning quarrels. Dr. Ellis walked along the pier with a thermos of coffee, "
    "counting the boats as she always did. Twelve were in; two were still out. She checked her watch "
    "and frowned, because the weather report had promised a calm night and the sea had not agreed.",
    "By six o'clock the first of the missing boats came around the point. Its engine coughed and "
    "sputtered, but it held a steady course toward the harbour mouth. The skipper waved from the "
    "wheelhouse, and Ellis waved back, relieved. The second boat was another matter. Nobody had heard "
    "from it since midnight, and the radio answered every call with static and nothing else. Ellis "
    "climbed the steps to the harbour office, where the old radio sat on a shelf by the window. She tried "
    "the distress channel, then the working channel, then the channel the skippers used for gossip. "
    "Nothing came back. Outside, the wind had dropped, and the water in the harbour lay flat and grey "
    "like a sheet of tin. She wrote the time in the log, put the kettle on, and waited for the others.",
    "At half past seven the coast guard launched a search. Volunteers gathered at the harbour office "
    "with charts and binoculars, and the baker brought bread nobody felt like eating. Shortly before "
    "noon a spotter plane found the boat drifting ten miles south, its crew tired and cold but safe. "
    "That evening the whole village came down to the pier to watch it towed home, and nobody spoke "
    "much, because nothing needed saying. The gulls, at last, resumed their quarrels overhead, as if "
    "to say that the ordinary business of the world could now go on. Ellis poured the last of her "
    "coffee into the water and went home to sleep for a very long time, dreaming of nothing at all.",
]



def write_manifest(path: Path, rows: list[dict | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def texts(n: int, prefix: str = "u") -> list[dict]:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    return [{"id": f"{prefix}{i:03d}", "text": f"Sentence {words[i % 8]} number {i}."} for i in range(n)]


def job_spec(kit_dir: Path, manifests: list[str], output: str, **over) -> JobSpec:
    raw = {
        "name": "test-job",
        "models": {"target": str(kit_dir / "target"), "draft": str(kit_dir / "draft"),
                   "codec": str(kit_dir / "codec")},
        "decoding": {"method": "exact", "max_new_tokens": 16, "seed": 1},
        "input": {"manifests": manifests},
        "output": {"uri": output, "audio_format": "flac"},
        "resources": {"workers": 2, "batch_size": 4, "rows_per_shard": 3, "cpus_per_worker": 1},
    }
    for key, value in over.items():
        merge = isinstance(value, dict) and isinstance(raw.get(key), dict)
        raw[key] = {**raw[key], **value} if merge else value
    return JobSpec.model_validate(raw)


def read_output(spec: JobSpec) -> list[dict]:
    """Every row of the job's dataset, shard by shard."""
    storage = Storage(spec.storage)
    rows = []
    for uri in storage.list(spec.output.uri.rstrip("/") + "/data"):
        fs, path = storage.arrow_filesystem(uri)
        rows.extend(pq.read_table(path, filesystem=fs).to_pylist())
    return rows


def audio_ok(row: dict) -> bool:
    samples, rate = sf.read(io.BytesIO(row["audio"]["bytes"]))
    return rate == 16_000 and len(samples) == 320 * len(row["codes"]) > 0


def comparable(rows: list[dict]) -> list[tuple]:
    return sorted((r["id"], tuple(r["codes"]), r["finish_reason"], r["error"],
                   r["audio"]["bytes"] if r["audio"] else None) for r in rows)


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = "8m"):
    """A tmpfs of `size` mounted at `where` (root only: skipped where mounting is refused)."""
    where.mkdir(parents=True)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                 capture_output=True, text=True)
        why = mounted.stderr.strip() or "mount failed" if mounted.returncode else None
    except OSError as exc:  # no mount command
        why = str(exc)
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs here ({why}): needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Take every free byte of `folder`'s filesystem with one file; returns it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        block = b"\0" * 65536
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    return filler
                block = block[: len(block) // 2]
    finally:
        os.close(fd)


class NemoManifest:
    """Reads a NeMo manifest as NeMo's speech datasets do, from the fields NeMo documents
    (https://docs.nvidia.com/nemo-framework/user-guide/latest/nemotoolkit/asr/datasets.html,
    "Manifest Format" and "Tarred Datasets"; relative paths: the audio datasets page,
    https://docs.nvidia.com/nemo-framework/user-guide/latest/nemotoolkit/audio/datasets.html):
    one JSON object a line with `audio_filepath` (absolute, or relative to the manifest's folder),
    `duration` (seconds) and `text`; a tarred dataset's lines name a member of the tar their
    `shard_id` picks, the tars and per-shard manifests given as brace patterns
    (`audio__OP_0..N_CL_.tar`, as scripts/speech_recognition/convert_to_tarred_audio_dataset.py
    writes them). NeMo itself is too heavy to install for these tests."""

    REQUIRED = ("audio_filepath", "duration", "text")

    @staticmethod
    def expand(pattern: str) -> list[str]:
        """`x__OP_0..2_CL_.tar` -> x_0.tar, x_1.tar, x_2.tar (NeMo's brace expansion)."""
        found = re.search(r"_OP_(\d+)\.\.(\d+)_CL_", pattern)
        if not found:
            return [pattern]
        first, last = int(found[1]), int(found[2])
        return [pattern[:found.start()] + str(n) + pattern[found.end():] for n in range(first, last + 1)]

    @classmethod
    def lines(cls, path: Path) -> list[dict]:
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for entry in entries:
            missing = [k for k in cls.REQUIRED if k not in entry]
            assert not missing, f"{path}: a line without {missing}"
        return entries

    @classmethod
    def read(cls, manifest: Path) -> list[tuple[dict, bytes]]:
        """(line, audio bytes) of a plain manifest."""
        out = []
        for entry in cls.lines(manifest):
            audio = Path(entry["audio_filepath"])
            out.append((entry, (audio if audio.is_absolute() else manifest.parent / audio).read_bytes()))
        return out

    @classmethod
    def read_tarred(cls, manifests: str, tars: str) -> list[tuple[dict, bytes]]:
        """(line, audio bytes) of a tarred dataset given as NeMo's brace patterns."""
        members = {}
        for n, tar_path in enumerate(cls.expand(tars)):
            with tarfile.open(tar_path) as tar:
                for m in tar.getmembers():
                    members[(n, m.name)] = tar.extractfile(m).read()
        out = []
        for path in cls.expand(manifests):
            for entry in cls.lines(Path(path)):
                out.append((entry, members[(entry["shard_id"], entry["audio_filepath"])]))
        return out


def lease_released(output: Path) -> bool:
    """Whether the output's lease was let go: its newest lease file alone is left, marked
    released (the fence of any older holder keeps refusing writes)."""
    files = sorted((Path(output) / "_lease").glob("*.json"))
    return len(files) == 1 and bool(json.loads(files[0].read_text()).get("released"))


def run_on_local_ray(spec: JobSpec) -> dict:
    """Run `spec` to its end on a local Ray of two CPUs started for it and shut down after;
    returns its summary."""
    import ray

    from engine.runtime.job import JobRunner

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        return JobRunner(spec, progress=False).run()
    finally:
        ray.shutdown()
