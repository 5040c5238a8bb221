"""`draft train` settings (pydantic: a bad value fails before any work, naming the field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.config import StorageOptions

PARTS = ("layers", "norm", "embeddings", "head")  # a draft's parts that training may change
DEFAULT_TRAINABLE = ("layers", "norm")

# Settings that may change between a run and its resumption (they do not change what a step does).
RESUMABLE_CHANGES = ("steps", "eval_every", "checkpoint_every", "keep_checkpoints", "device", "dtype",
                     "storage", "cache_target")


class DataSettings(BaseModel):
    """What every `draft train` kind reads and how it splits it (field descriptions are the
    documentation)."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(description="Training data: a .parquet/.jsonl file, or a directory / s3:// prefix of them.")
    temperature: float | None = Field(None, gt=0, description=(
        "KD / acceptance temperature; default: the temperature the dataset was sampled at, else 0.8."))
    max_length: int = Field(2048, ge=8, description="Tokens per sequence at most (prompt included).")
    warmup_steps: int = Field(20, ge=0, description="Linear learning-rate warm-up steps.")
    heldout_fraction: float = Field(0.05, ge=0, lt=1, description="Share of texts held out for evaluation.")
    heldout_max: int = Field(64, ge=0, description="Held-out sequences evaluated at most.")
    seed: int = Field(0, description="Data order seed.")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N (single-process runs).")
    storage: StorageOptions = Field(default_factory=StorageOptions, description=(
        "S3 endpoint/region/profile for s3:// data and models."))


class TrainSettings(DataSettings):
    """Everything `draft train` needs; field descriptions are the documentation."""

    draft: str = Field(description="Initial draft checkpoint (e.g. from `draft init`).")
    out: str = Field(description="Output directory: the trained draft, checkpoints/, train_log.jsonl, training.json.")
    target: str | None = Field(None, description="Target checkpoint: the teacher for kd, and held-out acceptance.")
    loss: Literal["auto", "kd", "tv", "ce"] = Field("auto", description=(
        "kd: forward KL to the target's softened distribution; tv: total variation to it (one "
        "minus the exact-SD acceptance, optimised directly); ce: cross-entropy on the codes; "
        "auto: kd for datasets this engine produced, ce for other code datasets."))
    steps: int = Field(1000, ge=1, description="Optimizer steps in total (a resumed run counts those done).")
    batch_size: int = Field(16, ge=1, description="Sequences per step, over all workers.")
    micro_batch_size: int | None = Field(None, ge=1, description="Sequences per forward on one worker (memory).")
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate (after warm-up; constant).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clip (0 = off).")
    trainable: list[str] = Field(list(DEFAULT_TRAINABLE), description=(
        f"Trained parts among {', '.join(PARTS)}; the rest is frozen (tied models: embeddings and "
        "head together)."))
    eval_every: int = Field(100, ge=0, description="Held-out evaluation every N steps (and at the end).")
    checkpoint_every: int = Field(200, ge=0, description="Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description=(
        "auto: bfloat16 autocast and a bfloat16 target where bfloat16 is native (CUDA; CPUs with "
        "AVX512-BF16 or AMX), float32 elsewhere; master weights are float32 either way."))
    cache_target: bool = Field(False, description=(
        "Keep the target's logits of every training sequence after first use (tokens x 65,537 x "
        "2 bytes in bfloat16 runs, 4 in float32): the target runs once per sequence; for datasets "
        "trained for several epochs (a run of at most one epoch keeps nothing: no sequence comes "
        "back)."))

    @field_validator("trainable")
    @classmethod
    def known_parts(cls, parts: list[str]) -> list[str]:
        unknown = sorted(set(parts) - set(PARTS))
        if unknown or not parts:
            raise ValueError(f"choose trainable parts among {', '.join(PARTS)}; got {parts}")
        return sorted(set(parts), key=PARTS.index)

    def fingerprint(self, loss: str, temperature: float) -> dict:
        """What must match for a run to be resumed (the resolved loss and temperature too)."""
        out = self.model_dump(exclude=set(RESUMABLE_CHANGES))
        out.update(loss=loss, temperature=temperature)
        return out
