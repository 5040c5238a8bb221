"""Training data: speech-code datasets -> token sequences -> padded batches.

Two sources, one reader:
  * a dataset this engine produced (`pcg-synth run` / `generate --out x.parquet`): columns `id`,
    `text`, `codes`, `finish_reason`, `settings`, `error`, ...; its codes are target samples, so
    it suits knowledge distillation;
  * `pcg-synth generate --out FILE.json` (codes + statistics, no codec needed): the same rows
    with each run's settings;
  * a user's code dataset: JSONL or Parquet rows with `text` and `codes` (the codec's codes of a
    whole utterance), optionally `prompt_text` + `prompt_codes` (a voice prompt).
A sequence is the Llasa prompt of the row's text followed by its codes, plus end-of-speech when
the utterance ended (`finish_reason == "eos"`, or no `finish_reason`: a complete utterance).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass

import torch

from engine.families.base import Prompter, SpeechLayout
from engine.io.storage import Storage

DATA_SUFFIXES = (".parquet", ".jsonl")
COLUMNS = ("id", "text", "codes", "finish_reason", "settings", "error", "prompt_text", "prompt_codes")


@dataclass(frozen=True)
class CodeSequence:
    """Token ids of one utterance; predictions of `ids[start:]` are trained (speech only)."""

    ids: tuple[int, ...]
    start: int  # first trained position: just after <|SPEECH_GENERATION_START|> (+ prompt codes)
    text: str

    @property
    def num_targets(self) -> int:
        return len(self.ids) - self.start


@dataclass
class Batch:
    """Right-padded inputs and the positions whose next token is trained.

    Attributes:
        input_ids: `[B, T]` (each sequence without its last token).
        rows, cols: `[N]` batch row and input position predicting each trained token.
        labels: `[N]` output-space ids of the trained tokens (a code's, or end-of-speech's: `eos_out`).
    """

    input_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    labels: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.labels.numel())

    def to(self, device: torch.device) -> Batch:
        return Batch(*(t.to(device) for t in (self.input_ids, self.rows, self.cols, self.labels)))


def data_files(uri: str, storage: Storage) -> list[str]:
    """The `.parquet` / `.jsonl` files at `uri` (a file, a directory or an S3 prefix), or `uri`
    itself when it names a `generate` JSON file (directories hold other JSON: summaries).

    Raises:
        ValueError: nothing readable there.
    """
    if uri.endswith(".json"):
        return [uri]
    files = [u for u in storage.list(uri) if u.endswith(DATA_SUFFIXES)]
    if not files:
        raise ValueError(f"no .parquet or .jsonl files at {uri}")
    return files


def read_parquet(uri: str, storage: Storage) -> list[dict]:
    import pyarrow.parquet as pq

    fs, path = storage.arrow_filesystem(uri)
    names = pq.read_schema(path, filesystem=fs).names
    table = pq.read_table(path, filesystem=fs, columns=[c for c in COLUMNS if c in names])
    return table.to_pylist()


def read_jsonl(uri: str, storage: Storage) -> list[dict]:
    rows = []
    for n, line in enumerate(io.StringIO(storage.read_bytes(uri).decode("utf-8")), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{uri}:{n}: not JSON ({exc.msg})") from None
    return rows


def read_generate_json(uri: str, storage: Storage) -> list[dict]:
    """Rows of a `pcg-synth generate --out FILE.json` document, each with its run's settings."""
    try:
        doc = json.loads(storage.read_bytes(uri).decode("utf-8"))
        runs = doc["runs"]
        return [{**{c: item.get(c) for c in COLUMNS if c != "settings"},
                 "settings": json.dumps(run["summary"]["settings"])}
                for run in runs for item in run["items"]]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{uri}: not a `pcg-synth generate --out FILE.json` document ({exc!r}); "
                         "use .parquet or .jsonl rows with text and codes") from None


READERS = {"parquet": read_parquet, "jsonl": read_jsonl, "json": read_generate_json}


def read_rows(uri: str, storage: Storage | None = None) -> list[dict]:
    """All rows of the dataset at `uri`, files in sorted order."""
    storage = storage or Storage()
    rows = []
    for f in data_files(uri, storage):
        rows.extend(READERS[f.rsplit(".", 1)[-1]](f, storage))
    return rows


def produced_by_engine(rows: list[dict]) -> bool:
    """True for this engine's output datasets (every row carries its decoding `settings`)."""
    return bool(rows) and all(r.get("settings") for r in rows)


def sampled_temperatures(rows: list[dict]) -> list:
    """The distinct temperatures in the rows' decoding `settings`, sorted."""
    temps = {json.loads(r["settings"]).get("temperature") for r in rows if r.get("settings")}
    return sorted(temps, key=str)


def sampling_temperature(rows: list[dict]) -> float | None:
    """The temperature the rows were sampled at, when they all agree on one above zero."""
    temps = sampled_temperatures(rows)
    return float(temps[0]) if len(temps) == 1 and temps[0] else None


def row_sequence(row: dict, prompter: Prompter, layout: SpeechLayout, max_length: int) -> CodeSequence:
    """One row -> its sequence (cut to `max_length` tokens).

    Raises:
        ValueError: why the row cannot be used (error record, no codes, bad codes, too long).
    """
    if row.get("error"):
        raise ValueError("error record")
    codes = [int(c) for c in (row.get("codes") or [])]
    if not codes:
        raise ValueError("no codes")
    code_ids = layout.token_ids(codes)  # raises on codes outside the codebook
    prompt = prompter.build(row.get("text") or "", row.get("prompt_text"), row.get("prompt_codes"), row.get("voice"))
    if len(prompt) >= max_length:
        raise ValueError(f"prompt of {len(prompt)} tokens leaves no room under max_length {max_length}")
    ended = row.get("finish_reason") in (None, "eos")
    ids = prompt + code_ids + ([layout.eos_token] if ended else [])
    return CodeSequence(ids=tuple(ids[:max_length]), start=len(prompt), text=row["text"])


def to_sequences(rows: list[dict], prompter: Prompter, layout: SpeechLayout,
                 max_length: int) -> tuple[list[CodeSequence], Counter]:
    """Usable rows -> sequences; returns them and a count of skipped rows by reason."""
    seqs, skipped = [], Counter()
    for row in rows:
        try:
            seqs.append(row_sequence(row, prompter, layout, max_length))
        except ValueError as exc:
            skipped[str(exc)] += 1
    return seqs, skipped


def is_heldout(text: str, fraction: float) -> bool:
    """Split by text (never by row), so one text is never on both sides."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") % 10_000
    return bucket < fraction * 10_000


def split_heldout(seqs: list[CodeSequence], fraction: float,
                  limit: int) -> tuple[list[CodeSequence], list[CodeSequence]]:
    """(train, held-out) with at most `limit` held-out sequences (extra ones are not trained on
    either: they stay unseen).

    Raises:
        ValueError: nothing left to train on.
    """
    heldout = [s for s in seqs if is_heldout(s.text, fraction)]
    train = [s for s in seqs if not is_heldout(s.text, fraction)]
    if not train:
        raise ValueError(f"no training sequences left after holding out {fraction:.0%} of texts")
    return train, heldout[:limit]


def make_batch(seqs: list[CodeSequence], layout: SpeechLayout) -> Batch:
    """Right-pad `seqs` (inputs drop each sequence's last token) and list the trained positions."""
    width = max(len(s.ids) - 1 for s in seqs)
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    rows, cols, labels = [], [], []
    for i, s in enumerate(seqs):
        ids = torch.tensor(s.ids, dtype=torch.long)
        input_ids[i, : len(ids) - 1] = ids[:-1]
        n = s.num_targets
        rows.append(torch.full((n,), i, dtype=torch.long))
        cols.append(torch.arange(s.start - 1, len(ids) - 1))
        targets = ids[s.start:]
        out = targets - layout.first_code
        labels.append(torch.where(targets == layout.eos_token, layout.eos_out, out))
    return Batch(input_ids, torch.cat(rows), torch.cat(cols), torch.cat(labels))


def batch_order(num: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of the global batch at `step`: epochs are seeded permutations, so the data order
    depends only on (seed, step) and a resumed run sees exactly what an uninterrupted one would."""
    size = min(batch_size, num)
    per_epoch = num // size
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(num, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return perm[k * size: (k + 1) * size].tolist()


def training_split(rows: list[dict], model, settings) -> tuple[list[CodeSequence], list[CodeSequence], Counter]:
    """(train, held-out, skipped rows by reason) of `rows` as sequences of `model`'s family
    (anything with `family`, `tokenizer` and `layout`), split as `settings` (`DataSettings`) say.

    Raises:
        ValueError: no usable rows, or none left to train on.
    """
    seqs, skipped = to_sequences(rows, model.family.prompter(model.tokenizer, model.layout), model.layout,
                                 settings.max_length)
    if not seqs:
        raise ValueError(f"{settings.data}: no usable rows ({dict(skipped) or 'empty'})")
    train, heldout = split_heldout(seqs, settings.heldout_fraction, settings.heldout_max)
    return train, heldout, skipped
