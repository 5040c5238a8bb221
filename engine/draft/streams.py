"""`draft train --kind streams`: distil stream heads (`engine.models.streams`) on the frozen
target's own samples.

The target runs once per training sequence (the engine's forward, the hidden states the heads
read at decode time); its head's logits at each position are the teacher. An anchor is a
position `j` a round may end at (from the last prompt token but one): the heads take `h_j` and the
token `x_{j+1}`, and head `k` learns the target's distribution at position `j + k` (the law of
`x_{j+1+k}`) by forward KL at the sampling temperature, for every `k` whose position holds a
generated token. A step trains on `anchors` anchors drawn from the training sequences (the draw
depends only on the seed and the step). Held-out acceptance per head is `1 - TV` between the
head's and the target's distributions, averaged over the held-out anchors: the chance that one
exact-SD proposal at that position is accepted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.draft.data import CodeSequence, produced_by_engine, read_rows, training_split
from engine.draft.objective import acceptance_sum, kd_loss_sum
from engine.draft.settings import DataSettings
from engine.models.llama import LlamaLM
from engine.models.streams import StreamHeads, save_streams, stream_shape_for


class StreamsSettings(DataSettings):
    """Everything `draft train --kind streams` needs; field descriptions are the documentation
    (the data fields are `draft train`'s)."""

    target: str = Field(description="Target checkpoint (the teacher; the heads run on it).")
    out: str = Field(description="Output directory: the heads (streams.safetensors, pcg_streams.json) "
                                 "and training.json.")
    heads: int = Field(4, ge=1, le=16, description="Stream heads: the largest gamma they can draft.")
    intermediate_size: int | None = Field(None, ge=1, description=(
        "Each head's MLP width (default: the target's hidden size)."))
    steps: int = Field(400, ge=1, description="Optimizer steps.")
    anchors: int = Field(128, ge=1, description="Anchor positions per step (each trains every head).")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (after warm-up; constant).")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description=(
        "The target's precision while its hidden states are computed (auto: bfloat16 where native); "
        "the heads train in float32."))


@dataclass
class Anchors:
    """Every anchor of some sequences: which sequence, the anchor position, and per head whether
    its target position holds a generated token."""

    seq: torch.Tensor  # [N]
    pos: torch.Tensor  # [N]
    valid: torch.Tensor  # [N, heads] bool

    def __len__(self) -> int:
        return len(self.seq)


def anchors_of(seqs: list[CodeSequence], heads: int) -> Anchors:
    """Anchors `j` from `start - 2` to `n - 3` of each sequence of `n` tokens (the heads need
    `x_{j+1}` and at least `x_{j+2}`); head `k` is trained where `j + k + 1 < n`."""
    seq, pos, valid = [], [], []
    k = torch.arange(1, heads + 1)
    for i, s in enumerate(seqs):
        n = len(s.ids)
        js = torch.arange(max(s.start - 2, 0), n - 2)
        seq.append(torch.full_like(js, i))
        pos.append(js)
        valid.append(js[:, None] + k + 1 < n)
    if not seq:
        return Anchors(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                       torch.zeros(0, heads, dtype=torch.bool))
    return Anchors(torch.cat(seq), torch.cat(pos), torch.cat(valid))


@torch.no_grad()
def hidden_states(target: LlamaLM, seqs: list[CodeSequence], progress: bool = False) -> list[torch.Tensor]:
    """The target's final-normed hidden states `[n - 1, H]` of each sequence's inputs (what a
    decode round hands the heads), one sequence at a time."""
    out = []
    for s in tqdm(seqs, desc="target hidden states", unit="seq", disable=bar_disabled(progress)):
        ids = torch.tensor(s.ids[:-1], device=target.device)[None]
        pos = torch.arange(ids.shape[1], device=target.device)[None]
        cache = target.new_cache(1, ids.shape[1])
        out.append(target(ids, pos, cache, ids.shape[1], logits_at="normed")[0].clone())  # not an inference tensor
    return out


class StreamsTrainer:
    """Trains `heads` on `train` sequences against `target` (frozen)."""

    def __init__(self, heads: StreamHeads, target: LlamaLM, train: list[CodeSequence],
                 heldout: list[CodeSequence], temperature: float, anchors: int, lr: float,
                 warmup_steps: int, seed: int, progress: bool = False) -> None:
        self.heads, self.target, self.temperature = heads, target.requires_grad_(False), temperature
        self.train_seqs, self.heldout_seqs = train, heldout
        self.train_h = hidden_states(target, train, progress)
        self.heldout_h = hidden_states(target, heldout, progress)
        self.train_anchors = anchors_of(train, heads.heads)
        self.heldout_anchors = anchors_of(heldout, heads.heads)
        if not len(self.train_anchors):
            raise ValueError("the training sequences hold no generated tokens for the heads to learn")
        self.anchors, self.lr, self.warmup, self.seed = anchors, lr, warmup_steps, seed
        self.optimizer = torch.optim.AdamW(heads.parameters(), lr=lr)
        self.step = 0

    def batch(self, seqs: list[CodeSequence], hidden: list[torch.Tensor], anchors: Anchors,
              which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden `[M, H]`, next-token ids `[M]`, teacher hidden `[M, heads, H]`, valid `[M, heads]`)
        of the anchors `which`."""
        k = self.heads.heads
        src, tok, teach = [], [], []
        for a in which.tolist():
            i, j = int(anchors.seq[a]), int(anchors.pos[a])
            h = hidden[i]
            src.append(h[j])
            tok.append(seqs[i].ids[j + 1])
            at = torch.clamp(torch.arange(j + 1, j + k + 1), max=h.shape[0] - 1)
            teach.append(h[at])
        device = self.target.device
        return (torch.stack(src), torch.tensor(tok, device=device), torch.stack(teach),
                anchors.valid[which].to(device))

    def head_logits(self, source: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """`[M, heads, V]` float32 logits of the heads (through the target's frozen head)."""
        states = self.heads.follow(self.target, source.float(), tokens)
        return self.target.project(self.target.model.norm(states.to(self.target.dtype)))

    def teacher_logits(self, teach: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.target.project(teach)

    def train_step(self) -> float:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        which = torch.randint(len(self.train_anchors), (self.anchors,), generator=gen)
        source, tokens, teach, valid = self.batch(self.train_seqs, self.train_h, self.train_anchors, which)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * min(1.0, (self.step + 1) / max(1, self.warmup))
        logits = self.head_logits(source, tokens)[valid]
        loss = kd_loss_sum(logits, self.teacher_logits(teach)[valid], self.temperature) / max(int(valid.sum()), 1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.heads.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        return loss.item()

    @torch.no_grad()
    def acceptance(self, chunk: int = 64) -> list[float] | None:
        """Mean held-out `1 - TV` per head (None without held-out anchors)."""
        anchors = self.heldout_anchors
        if not len(anchors):
            return None
        total = torch.zeros(self.heads.heads, dtype=torch.float64)
        count = torch.zeros(self.heads.heads, dtype=torch.float64)
        for start in range(0, len(anchors), chunk):
            which = torch.arange(start, min(start + chunk, len(anchors)))
            source, tokens, teach, valid = self.batch(self.heldout_seqs, self.heldout_h, anchors, which)
            logits, teacher = self.head_logits(source, tokens), self.teacher_logits(teach)
            for k in range(self.heads.heads):
                rows = valid[:, k]
                total[k] += float(acceptance_sum(logits[rows, k], teacher[rows, k], self.temperature))
                count[k] += int(rows.sum())
        return [round(float(t / c), 4) if c else math.nan for t, c in zip(total, count)]


def init_heads(target: LlamaLM, heads: int, intermediate_size: int | None, seed: int) -> StreamHeads:
    """Fresh heads for `target` in float32: small random weights, the projection of the hidden
    state close to the identity (head 1 starts near the target's own next-token guess)."""
    torch.manual_seed(seed)
    module = StreamHeads(stream_shape_for(target.shape, heads, intermediate_size)).to(target.device)
    h = target.shape.hidden_size
    with torch.no_grad():
        module.proj.weight.normal_(0.0, 0.02 / math.sqrt(2))
        module.proj.weight[:, :h] += torch.eye(h, device=target.device)
        for block in module.blocks:
            block.gate_up.weight.normal_(0.0, 0.02)
            block.down.weight.normal_(0.0, 0.02 / math.sqrt(2 * heads))
    return module


def target_record(target: LlamaLM, path: str | Path) -> dict:
    """What heads record about the target they were made for (checked at load)."""
    return {"path": str(path), "hidden_size": target.shape.hidden_size, "vocab_out": target.vocab_out,
            "num_layers": target.shape.num_layers}


def train_heads(target: LlamaLM, target_path: str | Path, train: list[CodeSequence], heldout: list[CodeSequence],
                out: str | Path, heads: int = 4, intermediate_size: int | None = None, temperature: float = 0.8,
                steps: int = 400, anchors: int = 128, lr: float = 1e-3, warmup_steps: int = 20, seed: int = 0,
                progress: bool = False) -> dict:
    """Distil fresh heads on `train` and write them to `out`; returns the training record
    (held-out acceptance per head before and after, losses)."""
    module = init_heads(target, heads, intermediate_size, seed)
    trainer = StreamsTrainer(module, target, train, heldout, temperature, anchors, lr, warmup_steps, seed,
                             progress)
    before = trainer.acceptance()
    losses = []
    for _ in tqdm(range(steps), desc="stream heads", unit="step", disable=bar_disabled(progress)):
        losses.append(trainer.train_step())
    record = {"kind": "streams", "loss": "kd", "temperature": temperature, "steps": steps, "anchors": anchors,
              "lr": lr, "seed": seed, "sequences": len(train), "heldout_sequences": len(heldout),
              "train_anchors": len(trainer.train_anchors), "loss_first": round(losses[0], 6),
              "loss_last": round(losses[-1], 6), "acceptance_before": before,
              "acceptance_after": trainer.acceptance(),
              "parameters": module.num_parameters(), "target_parameters": target.num_parameters()}
    save_streams(out, module, target_record(target, target_path), record)
    return record


def train_streams(settings: StreamsSettings, progress: bool = True) -> dict:
    """`draft train --kind streams` on one device: read the data, load the target, distil the
    heads, write them and `training.json` to `settings.out`; returns the training record."""
    from engine.draft.run import resolve_temperature
    from engine.io.storage import Storage
    from engine.models.device import resolve_device, resolve_dtype
    from engine.models.loading import load_model

    storage = Storage(settings.storage)
    target_dir = storage.local_dir(settings.target)
    device = resolve_device(settings.device)
    dtype = "bfloat16" if resolve_dtype(settings.dtype, device) == torch.bfloat16 else "float32"
    loaded = load_model(target_dir, device=device, dtype=dtype, prepack=False)
    rows = read_rows(settings.data, storage)
    if not produced_by_engine(rows):
        raise ValueError(f"{settings.data}: stream heads distil the target on its own samples; these rows "
                         "were not produced by the engine (generate or a job with method ar)")
    temperature, source = resolve_temperature(settings, rows, loaded.family)
    train, heldout, skipped = training_split(rows, loaded, settings)
    print(f"stream heads: {settings.heads} heads, kd at temperature {temperature:g} ({source}); "
          f"{len(train)} training sequences, {len(heldout)} held out")
    record = train_heads(loaded.model, settings.target, train, heldout, settings.out, settings.heads,
                         settings.intermediate_size, temperature, settings.steps, settings.anchors, settings.lr,
                         settings.warmup_steps, settings.seed, progress)
    summary = {"settings": settings.model_dump(), "skipped_rows": dict(skipped), "final": record}
    (Path(settings.out) / "training.json").write_text(json.dumps(summary, indent=1))
    return record
