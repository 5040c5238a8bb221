"""`draft train --kind streams`: distil stream heads (`engine.models.streams`) on the frozen
target's own samples.

The target runs once per training sequence (the engine's forward, the hidden states the heads
read at decode time); its head's logits at each position are the teacher. An anchor is a
position `j` a round may end at (from the last prompt token but one): the heads take `h_j` and the
token `x_{j+1}`, and head `k` learns the target's distribution at position `j + k` (the law of
`x_{j+1+k}`) by forward KL at the sampling temperature, for every `k` whose position holds a
generated token. A step trains on `anchors` anchors drawn from the training sequences (the draw
depends only on the seed and the step; `--workers N` splits each step's draw across N Ray Train
workers, `engine.draft.streams_ray`). Held-out acceptance per head is `1 - TV` between the
head's and the target's distributions, averaged over the held-out anchors: the chance that one
exact-SD proposal at that position is accepted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
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


@dataclass(frozen=True)
class HeadsHyper:
    """What distilling stream heads does (`train_heads`); `StreamsSettings` holds the same names
    for the CLI, with the temperature still to resolve against the data.

    Attributes:
        heads: stream heads: the largest gamma they can draft.
        intermediate_size: each head's MLP width (None: the target's hidden size).
        temperature: KD softening and held-out acceptance: the sampling temperature.
        steps: optimizer steps.
        anchors: anchor positions per step (each trains every head).
        lr: AdamW learning rate (after warm-up; constant).
        warmup_steps: linear learning-rate warm-up steps.
        seed: initial weights and anchor draws.
    """

    heads: int = 4
    intermediate_size: int | None = None
    temperature: float = 0.8
    steps: int = 400
    anchors: int = 128
    lr: float = 1e-3
    warmup_steps: int = 20
    seed: int = 0

    @classmethod
    def from_settings(cls, settings: StreamsSettings, temperature: float) -> HeadsHyper:
        """The step settings of `settings`, at the resolved `temperature`."""
        return cls(heads=settings.heads, intermediate_size=settings.intermediate_size, temperature=temperature,
                   steps=settings.steps, anchors=settings.anchors, lr=settings.lr,
                   warmup_steps=settings.warmup_steps, seed=settings.seed)


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


class HeadsChain(torch.nn.Module):
    """The heads' `chain` as `forward`: what a data-parallel wrapper (DDP) wraps, since gradients
    are only synchronised for what runs through the wrapper's `forward`."""

    def __init__(self, heads: StreamHeads) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.heads.chain(hidden, embedded)


class StreamsTrainer:
    """Trains `heads` on `train` sequences against `target` (frozen), with `hyper`'s temperature,
    anchors per step, learning rate, warm-up and seed (its shape fields made `heads`).

    `wrap` (e.g. `ray.train.torch.prepare_model`) wraps `HeadsChain(heads)` for data-parallel
    training steps (`train_step(rank, world)`); held-out acceptance runs the bare heads."""

    def __init__(self, heads: StreamHeads, target: LlamaLM, train: list[CodeSequence],
                 heldout: list[CodeSequence], hyper: HeadsHyper, progress: bool = False,
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> None:
        self.heads, self.target, self.temperature = heads, target.requires_grad_(False), hyper.temperature
        self.chain = wrap(HeadsChain(heads)) if wrap is not None else heads.chain
        self.train_seqs, self.heldout_seqs = train, heldout
        self.train_h = hidden_states(target, train, progress)
        self.heldout_h = hidden_states(target, heldout, progress)
        self.train_anchors = anchors_of(train, heads.heads)
        self.heldout_anchors = anchors_of(heldout, heads.heads)
        if not len(self.train_anchors):
            raise ValueError("the training sequences hold no generated tokens for the heads to learn")
        self.anchors, self.lr, self.warmup, self.seed = hyper.anchors, hyper.lr, hyper.warmup_steps, hyper.seed
        self.optimizer = torch.optim.AdamW(heads.parameters(), lr=hyper.lr)
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

    def head_logits(self, source: torch.Tensor, tokens: torch.Tensor, train: bool = False) -> torch.Tensor:
        """`[M, heads, V]` float32 logits of the heads (through the target's frozen head); `train`:
        through the (possibly data-parallel) training chain."""
        if train:
            states = self.chain(source.float(), self.target.model.embed_tokens(tokens))
        else:
            states = self.heads.follow(self.target, source.float(), tokens)
        return self.target.project(self.target.model.norm(states.to(self.target.dtype)))

    def teacher_logits(self, teach: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.target.project(teach)

    def train_step(self, rank: int = 0, world: int = 1) -> float:
        """One optimizer step; returns the step's loss (the whole draw's, on every rank).

        The step's anchors are drawn as one process draws them (seed and step); of `world`
        data-parallel ranks, `rank` takes every `world`-th anchor from its `rank`-th. Its loss is
        its share's KD sum over the whole draw's valid count, times `world` (the wrapper averages
        the ranks' gradients): the ranks together compute the single-process gradient.
        """
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        which = torch.randint(len(self.train_anchors), (self.anchors,), generator=gen)
        count = max(int(self.train_anchors.valid[which].sum()), 1)
        if world > 1:
            which = which[rank::world]
        source, tokens, teach, valid = self.batch(self.train_seqs, self.train_h, self.train_anchors, which)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * min(1.0, (self.step + 1) / max(1, self.warmup))
        logits = self.head_logits(source, tokens, train=True)[valid]
        loss = kd_loss_sum(logits, self.teacher_logits(teach)[valid], self.temperature) / count
        if world > 1:
            loss = loss * world
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.heads.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        if world > 1:  # the ranks' shares / world, summed: the whole draw's loss
            total = loss.detach() / world
            torch.distributed.all_reduce(total)
            return total.item()
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


def heads_record(trainer: StreamsTrainer, hyper: HeadsHyper, losses: list[float], before: list[float] | None) -> dict:
    """The training record of `trainer`'s heads after `losses` (one per step), with held-out
    acceptance `before` training and now."""
    return {"kind": "streams", "loss": "kd", "temperature": hyper.temperature, "steps": hyper.steps,
            "anchors": hyper.anchors, "lr": hyper.lr, "seed": hyper.seed, "sequences": len(trainer.train_seqs),
            "heldout_sequences": len(trainer.heldout_seqs), "train_anchors": len(trainer.train_anchors),
            "loss_first": round(losses[0], 6), "loss_last": round(losses[-1], 6), "acceptance_before": before,
            "acceptance_after": trainer.acceptance(),
            "parameters": trainer.heads.num_parameters(), "target_parameters": trainer.target.num_parameters()}


def train_heads(target: LlamaLM, target_path: str | Path, train: list[CodeSequence], heldout: list[CodeSequence],
                out: str | Path, hyper: HeadsHyper = HeadsHyper(), progress: bool = False) -> dict:
    """Distil fresh heads (`hyper`) on `train` and write them to `out`; returns the training
    record (held-out acceptance per head before and after, losses)."""
    module = init_heads(target, hyper.heads, hyper.intermediate_size, hyper.seed)
    trainer = StreamsTrainer(module, target, train, heldout, hyper, progress)
    before = trainer.acceptance()
    losses = []
    for _ in tqdm(range(hyper.steps), desc="stream heads", unit="step", disable=bar_disabled(progress)):
        losses.append(trainer.train_step())
    record = heads_record(trainer, hyper, losses, before)
    save_streams(out, module, target_record(target, target_path), record)
    return record


@dataclass
class StreamsSetup:
    """What training stream heads starts from (`setup_streams`): the loaded target, the split
    sequences, the rows skipped and the resolved step settings."""

    target: LlamaLM
    train: list[CodeSequence]
    heldout: list[CodeSequence]
    skipped: dict
    hyper: HeadsHyper
    temperature_source: str

    def describe(self, heads: int) -> str:
        return (f"stream heads: {heads} heads, kd at temperature {self.hyper.temperature:g} "
                f"({self.temperature_source}); {len(self.train)} training sequences, {len(self.heldout)} held out")


def setup_streams(settings: StreamsSettings, device: str | torch.device | None = None) -> StreamsSetup:
    """Read the data, load the target (on `device`, default `settings.device`) and split the
    sequences as every run of `settings` does (one process or each Ray Train worker).

    Raises:
        ValueError: rows the engine did not produce (the heads distil the target's own samples).
    """
    from engine.draft.run import resolve_temperature
    from engine.io.storage import Storage
    from engine.models.device import resolve_device, resolve_dtype
    from engine.models.loading import load_model

    storage = Storage(settings.storage)
    target_dir = storage.local_dir(settings.target)
    device = resolve_device(settings.device if device is None else device)
    dtype = "bfloat16" if resolve_dtype(settings.dtype, device) == torch.bfloat16 else "float32"
    loaded = load_model(target_dir, device=device, dtype=dtype, prepack=False)
    rows = read_rows(settings.data, storage)
    if not produced_by_engine(rows):
        raise ValueError(f"{settings.data}: stream heads distil the target on its own samples; these rows "
                         "were not produced by the engine (generate or a job with method ar)")
    temperature, source = resolve_temperature(settings, rows, loaded.family)
    train, heldout, skipped = training_split(rows, loaded, settings)
    return StreamsSetup(loaded.model, train, heldout, dict(skipped), HeadsHyper.from_settings(settings, temperature),
                        source)


def write_training(settings: StreamsSettings, skipped: dict, record: dict) -> None:
    """`training.json` in `settings.out`: the settings, the rows skipped and the final record."""
    summary = {"settings": settings.model_dump(), "skipped_rows": dict(skipped), "final": record}
    (Path(settings.out) / "training.json").write_text(json.dumps(summary, indent=1))


def train_streams(settings: StreamsSettings, progress: bool = True) -> dict:
    """`draft train --kind streams` on one device: read the data, load the target, distil the
    heads, write them and `training.json` to `settings.out`; returns the training record
    (`engine.draft.streams_ray.train_streams_ray`: the same on N Ray Train workers)."""
    setup = setup_streams(settings)
    print(setup.describe(settings.heads))
    record = train_heads(setup.target, settings.target, setup.train, setup.heldout, settings.out, setup.hyper,
                         progress)
    write_training(settings, setup.skipped, record)
    return record
