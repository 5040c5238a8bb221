"""Typed settings. Field descriptions are the documentation."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.decoding.sampling import Warp

Method = Literal["ar", "exact", "pcg", "ssd", "topk"]


class DecodingSettings(BaseModel):
    """How to decode: acceptance rule, speculation depth and sampling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method = Field("pcg", description=(
        "Acceptance rule: 'ar' (target alone, exact), 'exact' (standard speculative sampling, "
        "token-level exact), 'pcg' (group-level exact), 'ssd' (relaxed by beta, no guarantee), "
        "'topk' (accept inside the target's top-k, no guarantee)."))
    gamma: int = Field(3, ge=1, le=32, description="Draft tokens per round (ignored by 'ar').")
    theta: float = Field(0.4, gt=0.0, le=1.0, description=(
        "PCG: cosine threshold of the acoustic similarity groups, in (0, 1]; 1 gives singleton "
        "groups (PCG = exact). The paper found 0.38-0.45 best on Llasa-8B."))
    max_group_size: int | None = Field(None, ge=1, description=(
        "PCG: cap on group size (kNN with k = cap, then threshold); truncated groups are counted."))
    max_thinning_trials: int = Field(8, ge=1, le=256, description=(
        "PCG: thinning trials for the recovered token before the exact dense fallback."))
    beta: float = Field(0.3, ge=0.0, description="SSD: added to the acceptance ratio.")
    topk: int = Field(50, ge=1, description="topk: accept a draft token inside the target's top-k.")
    temperature: float = Field(0.8, ge=0.0, description="0 is greedy; Llasa's card uses 0.8.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1 = off).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0 = off).")
    repetition_penalty: float = Field(1.0, gt=0.0, description="CTRL-style penalty (1 = off).")
    max_new_tokens: int = Field(2000, ge=1, description=(
        "Speech tokens to generate at most (50 per second of audio); the context limit may cut "
        "it shorter."))
    seed: int = Field(0, ge=0, description=(
        "Job seed; each item's seed is derived from it and the item's id unless given."))

    @model_validator(mode="after")
    def _check(self) -> "DecodingSettings":
        if self.temperature == 0 and (self.top_p < 1 or self.top_k):
            raise ValueError("top_p/top_k have no effect at temperature 0 (greedy): leave them off")
        return self

    @property
    def speculative(self) -> bool:
        return self.method != "ar"

    @property
    def warp(self) -> Warp:
        return Warp(self.temperature, self.top_k, self.top_p, self.repetition_penalty)
