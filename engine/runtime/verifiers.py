"""The quality gate's verifiers in a process of their own, beside a worker's decode loop.

A worker's verify thread runs beside its decode thread, in the same process, and so under the
same GIL; pocketsphinx (the bundled ASR) holds the GIL for the whole decode of an utterance,
which would stall the decode loop between its torch ops for as long. So a worker runs its
verifiers (the ASR and the speaker encoder) in a child process: the verify thread sends it
audio through a pipe and waits there with the GIL released, and everything else of the gate
(edit distances, bounds, decisions) stays in the worker. The child uses one CPU thread for its
torch ops and ends when its worker does (its pipe closes).
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from collections.abc import Sequence

import numpy as np

from engine.config import QualitySpec, StorageOptions
from engine.metrics.gate import VerifierLost


def serve(conn, quality_json: str, device: str, storage_json: str) -> None:
    """The child: load the verifiers, then answer `(method, args)` calls until the pipe closes."""
    import torch

    from engine.io.storage import Storage
    from engine.metrics.gate import QualityGate

    torch.set_num_threads(1)
    try:
        gate = QualityGate.load(QualitySpec.model_validate_json(quality_json), None, device,
                                Storage(StorageOptions.model_validate_json(storage_json)))
    except Exception as exc:  # noqa: BLE001 - the worker raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", {"asr": getattr(gate.asr, "name", None), "speaker": getattr(gate.speaker, "name", None)}))
    calls = {"transcribe": gate.transcribe, "embed": lambda wave: gate.speaker.embed(wave)}
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):  # the worker is gone
            return
        try:
            result = calls[method](*args)
        except Exception as exc:  # noqa: BLE001 - raised in the worker, on that call
            conn.send(("raised", portable(exc)))
            continue
        if method == "transcribe":  # a clip's failure comes back in its place
            result = [portable(r) if isinstance(r, BaseException) else r for r in result]
        conn.send(("ok", result))


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - unpicklable exceptions exist (C extensions)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class VerifierProcess:
    """A child process holding a quality gate's ASR and speaker encoder; one that died is
    started again by the next call (the call that found it dead raises `VerifierLost`).

    Args:
        quality: the gate (which verifiers to load).
        device: where they run (`cpu`, `cuda:N`).
        storage: how to reach verifier checkpoints on object storage.

    Raises:
        ValueError: a verifier could not be loaded (the child's error).
    """

    def __init__(self, quality: QualitySpec, device: str, storage: StorageOptions) -> None:
        self.args = (quality.model_dump_json(), device, storage.model_dump_json())
        self.lock = threading.Lock()
        self.names = self.start()

    def start(self) -> dict:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads and a CUDA context
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, name="verifiers", daemon=True, args=(child, *self.args))
        self.process.start()
        child.close()
        status, body = self.conn.recv()
        if status == "error":
            self.close()
            raise ValueError(f"quality gate: {body}")
        return body

    def call(self, method: str, *args):
        """The child's answer to one call (its exception raised here).

        Raises:
            VerifierLost: the child died (before or during the call).
        """
        with self.lock:
            if not self.process.is_alive():
                self.close()
                self.start()
            try:
                self.conn.send((method, args))
                status, body = self.conn.recv()
            except (EOFError, OSError) as exc:
                raise VerifierLost(f"the verifier process died ({exc or type(exc).__name__})") from None
        if status == "raised":
            raise body
        return body

    def close(self) -> None:
        self.conn.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


class RemoteASR:
    """The child's recogniser, as a `metrics.asr.Recognizer` (per clip failures come back in
    place, as `QualityGate.transcribe` gives them)."""

    def __init__(self, process: VerifierProcess) -> None:
        self.process, self.name = process, process.names["asr"]

    def transcribe(self, waves: Sequence[np.ndarray]) -> list:
        return self.process.call("transcribe", [np.asarray(w, dtype=np.float32) for w in waves])


class RemoteSpeaker:
    """The child's speaker encoder, as a `metrics.speaker.SpeakerEncoder`."""

    def __init__(self, process: VerifierProcess) -> None:
        self.process, self.name = process, process.names["speaker"]

    def embed(self, wave: np.ndarray) -> np.ndarray:
        return self.process.call("embed", np.asarray(wave, dtype=np.float32))
