"""The training loop shared by every entry point (CLI on one device, Ray Train workers, the kit).

One step: the global batch for this step (a function of seed and step only), this worker's
share of it (`[rank::world]`), micro-batches, and the loss normalised by the *global* number of
trained tokens times the world size, so that DDP's gradient averaging gives exactly the
single-process gradient.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.draft.data import Batch, CodeSequence, batch_order, make_batch
from engine.draft.objective import TEACHER_LOSSES, SpeechLM, acceptance_sum, ce_loss_sum
from engine.families.base import SpeechLayout

Loss = Literal["kd", "tv", "ce"]


@dataclass(frozen=True)
class Hyper:
    """What a step does (everything that must match for a run to be resumed)."""

    loss: Loss = "kd"
    temperature: float = 0.8  # KD softening and held-out acceptance: the sampling temperature
    batch_size: int = 16  # sequences per step over all workers
    micro_batch_size: int | None = None  # sequences per forward on one worker (None: all)
    lr: float = 2e-4
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    # Keep the target's logits of every training sequence after their first use (tokens x V_out
    # x 4 bytes): for small datasets seen for many epochs, such as the kit's.
    cache_target: bool = False

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then constant: no dependence on the run's length, so a finished run
        can be continued for more steps."""
        return self.lr * min(1.0, (step + 1) / max(1, self.warmup_steps))


@dataclass(frozen=True)
class Placement:
    """Where a trainer runs and which share of every batch is its own.

    Attributes:
        device: where batches go.
        forward: the module to call for the draft's logits (a DDP wrapper under Ray Train);
            None: the draft itself.
        rank, world: this worker's share of every batch (`[rank::world]`).
        autocast: bfloat16 autocast for the draft's forward (CUDA, or CPUs with native bf16);
            cached target logits are then kept in bfloat16.
    """

    device: torch.device
    forward: torch.nn.Module | None = None
    rank: int = 0
    world: int = 1
    autocast: bool = False


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum across workers (identity without torch.distributed)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return t.tolist()


class DraftTrainer:
    """Trains `draft` on `train` sequences.

    Args:
        hyper: step settings.
        draft: the trainable model (its trainable parameters already chosen).
        target: the teacher for `kd` and for held-out acceptance; None for `ce` without one.
        layout: the family's token layout.
        train, heldout: sequences.
        placement: device, forward module, this worker's share, autocast.
    """

    def __init__(self, hyper: Hyper, draft: SpeechLM, target: SpeechLM | None, layout: SpeechLayout,
                 train: list[CodeSequence], heldout: list[CodeSequence], placement: Placement) -> None:
        world = placement.world
        if hyper.loss in TEACHER_LOSSES and target is None:
            raise ValueError(f"the {hyper.loss} loss distils the target: it needs --target DIR")
        if not train:
            raise ValueError("no training sequences")
        if min(hyper.batch_size, len(train)) < world:
            raise ValueError(f"a batch of {min(hyper.batch_size, len(train))} sequences cannot feed "
                             f"{world} workers: raise --batch-size or use fewer workers")
        self.hyper, self.draft, self.target, self.layout = hyper, draft, target, layout
        self.train_seqs, self.heldout = train, heldout
        self.device, self.rank, self.world = torch.device(placement.device), placement.rank, world
        self.forward = placement.forward or draft
        self.autocast = placement.autocast
        self.params = [p for p in draft.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=hyper.lr, weight_decay=hyper.weight_decay)
        self.step = 0
        self._target_cache: dict[int, torch.Tensor] = {}
        self._heldout_cache: dict[int, torch.Tensor] = {}
        self.cache_train = hyper.cache_target  # `run` keeps it only for runs longer than an epoch

    def _autocast(self):
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _chunks(self, items: list) -> list[list]:
        size = self.hyper.micro_batch_size or max(1, len(items))
        return [items[i: i + size] for i in range(0, len(items), size)]

    @torch.no_grad()
    def _target_logits(self, batch: Batch, indices: list[int] | None = None) -> torch.Tensor:
        """`[N, V_out]` target logits; from the cache for training sequences when enabled."""
        if indices is None or not self.cache_train:
            return self.target(batch.input_ids, batch.rows, batch.cols)
        missing = [i for i in indices if i not in self._target_cache]
        if missing:
            seqs = [self.train_seqs[i] for i in missing]
            fresh = make_batch(seqs, self.layout).to(self.device)
            logits = self.target(fresh.input_ids, fresh.rows, fresh.cols)
            kept = torch.bfloat16 if self.autocast else logits.dtype  # half the memory in bf16 runs
            for i, part in zip(missing, logits.split([s.num_targets for s in seqs])):
                self._target_cache[i] = part.to(kept)
        return torch.cat([self._target_cache[i] for i in indices]).float()

    def _loss_sum(self, indices: list[int]) -> torch.Tensor:
        batch = make_batch([self.train_seqs[i] for i in indices], self.layout).to(self.device)
        with self._autocast():
            logits = self.forward(batch.input_ids, batch.rows, batch.cols)
        if self.hyper.loss in TEACHER_LOSSES:
            return TEACHER_LOSSES[self.hyper.loss](logits, self._target_logits(batch, indices),
                                                   self.hyper.temperature)
        return ce_loss_sum(logits, batch.labels)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps until every training sequence has been used once (`batch_order`)."""
        return len(self.train_seqs) // min(self.hyper.batch_size, len(self.train_seqs))

    def caches_for(self, steps: int) -> bool:
        """Whether a run to `steps` keeps training sequences' target logits: with `cache_target`,
        only past one epoch (within one no sequence comes back, so a cache only holds memory)."""
        return self.hyper.cache_target and steps > self.steps_per_epoch

    def train_step(self) -> dict:
        """One optimizer step; returns `{step, loss, tokens, lr}` (loss per trained token,
        over all workers)."""
        self.draft.train()
        order = batch_order(len(self.train_seqs), self.hyper.batch_size, self.step, self.hyper.seed)
        global_tokens = sum(self.train_seqs[i].num_targets for i in order)
        lr = self.hyper.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        local = 0.0
        chunks = self._chunks(order[self.rank:: self.world])
        for i, chunk in enumerate(chunks):
            # Under DDP only the last backward all-reduces (the others accumulate locally), so
            # workers with different micro-batch counts still meet in exactly one all-reduce.
            sync = i == len(chunks) - 1 or not hasattr(self.forward, "no_sync")
            with contextlib.nullcontext() if sync else self.forward.no_sync():
                loss_sum = self._loss_sum(chunk)
                (loss_sum * (self.world / global_tokens)).backward()
            local += loss_sum.item()
        if self.hyper.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.hyper.grad_clip)
        self.optimizer.step()
        self.step += 1
        (total,) = all_reduce_sum([local], self.device)
        return {"step": self.step, "loss": total / global_tokens, "tokens": global_tokens, "lr": lr}

    @torch.no_grad()
    def _heldout_logits(self, chunk: int, batch: Batch) -> torch.Tensor:
        """Target logits of held-out chunk `chunk` (kept across evaluations with `cache_target`)."""
        if not self.hyper.cache_target:
            return self._target_logits(batch)
        if chunk not in self._heldout_cache:
            logits = self._target_logits(batch)
            self._heldout_cache[chunk] = logits.to(torch.bfloat16 if self.autocast else logits.dtype)
        return self._heldout_cache[chunk].float()

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss per token and, with a target, expected exact-SD acceptance per token
        (`1 - TV` at the sampling temperature, teacher-forced on the held-out sequences)."""
        if not self.heldout:
            return {}
        self.draft.eval()
        sums = [0.0, 0.0, 0.0]  # loss, acceptance, tokens
        for n, chunk in enumerate(self._chunks(self.heldout[self.rank:: self.world])):
            batch = make_batch(chunk, self.layout).to(self.device)
            with self._autocast():
                logits = self.draft(batch.input_ids, batch.rows, batch.cols)
            target = self._heldout_logits(n, batch) if self.target is not None else None
            if self.hyper.loss in TEACHER_LOSSES:
                sums[0] += TEACHER_LOSSES[self.hyper.loss](logits, target, self.hyper.temperature).item()
            else:
                sums[0] += ce_loss_sum(logits, batch.labels).item()
            if target is not None:
                sums[1] += acceptance_sum(logits, target, self.hyper.temperature).item()
            sums[2] += batch.tokens
        loss, acc, tokens = all_reduce_sum(sums, self.device)
        out = {"heldout_loss": loss / tokens, "heldout_tokens": int(tokens)}
        if self.target is not None:
            out["heldout_acceptance"] = acc / tokens
        return out

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Trainable tensors by checkpoint name, on the CPU in float32."""
        return {name: p.detach().to("cpu", torch.float32).clone()
                for name, p in self.draft.lm.named_parameters() if p.requires_grad}

    def load_trainable_state(self, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self.draft.lm.named_parameters())
        missing = sorted(n for n, p in params.items() if p.requires_grad and n not in tensors)
        if missing or set(tensors) - set(params):
            raise ValueError(f"checkpoint does not match the trainable parts (missing {missing[:3]})")
        with torch.no_grad():
            for name, value in tensors.items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))

    def run(self, steps: int, eval_every: int = 0, checkpoint_every: int = 0,
            on_log: Callable[[dict], None] | None = None,
            on_checkpoint: Callable[[DraftTrainer, dict], None] | None = None,
            progress: bool = False) -> dict:
        """Train until `steps` (counting steps already done), evaluating and checkpointing
        every so often and at the end; returns the last logged record. Target logits are cached
        as `caches_for(steps)` says."""
        self.cache_train = self.caches_for(steps)
        record: dict = {"step": self.step}
        if self.step == 0 and self.heldout:
            record = {"step": 0, **self.evaluate()}
            on_log and on_log(record)
        bar = tqdm(total=steps, initial=self.step, desc="draft train", unit="step",
                   disable=bar_disabled(progress and self.rank == 0))
        start = time.perf_counter()
        while self.step < steps:
            record = self.train_step()
            last = self.step == steps
            if last or (eval_every and self.step % eval_every == 0):
                record.update(self.evaluate())
            record["elapsed_s"] = round(time.perf_counter() - start, 3)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
            on_log and on_log(record)
            if on_checkpoint and (last or (checkpoint_every and self.step % checkpoint_every == 0)):
                on_checkpoint(self, record)
        bar.close()
        if not math.isfinite(record.get("loss", 0.0)):
            raise FloatingPointError(f"training diverged (loss {record['loss']}); lower --lr")
        return record
