"""The trainable side: a transformers Llama that emits logits over the output space only, which
parts of it train, and the losses.

Logits are computed from the final hidden states at the loss positions against the head rows of
the speech tokens and end-of-speech (65,537 of Llasa's 193,800): the sampler never emits text
tokens, and the full head would cost 3x more for nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.draft.settings import PARTS
from engine.hf import from_transformers


class SpeechLM(nn.Module):
    """`LlamaForCausalLM` + the output-space rows of its head.

    Args:
        lm: a transformers `LlamaForCausalLM`.
        output_ids: `[V_out]` vocabulary ids of the output space (speech tokens, end-of-speech).
    """

    def __init__(self, lm: nn.Module, output_ids: torch.Tensor) -> None:
        super().__init__()
        self.lm = lm
        self.output_ids = output_ids.long()
        self._frozen_rows: torch.Tensor | None = None  # not a buffer: DDP would broadcast it

    @classmethod
    def load(cls, path: str | Path, output_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> SpeechLM:
        """Load a Hugging Face Llama checkpoint directory (ours or anyone's)."""
        LlamaForCausalLM = from_transformers("LlamaForCausalLM")
        hf_logging = from_transformers("logging", "transformers.utils")

        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # a bar per small checkpoint is noise
        try:
            lm = LlamaForCausalLM.from_pretrained(str(path), dtype=dtype)
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        return cls(lm.to(device), output_ids)

    @property
    def tied(self) -> bool:
        return self.lm.get_output_embeddings().weight is self.lm.get_input_embeddings().weight

    def head_rows(self) -> torch.Tensor:
        """`[V_out, hidden]` head rows of the output space (cached while the head is frozen)."""
        weight = self.lm.get_output_embeddings().weight
        if weight.requires_grad:
            self._frozen_rows = None
            return weight[self.output_ids.to(weight.device)]
        if self._frozen_rows is None or self._frozen_rows.device != weight.device:
            self._frozen_rows = weight.detach()[self.output_ids.to(weight.device)]
        return self._frozen_rows

    def forward(self, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Output-space logits at chosen positions.

        Args:
            input_ids: `[B, T]` right-padded token ids (causal attention: padding after a row's
                end never reaches its positions, so no attention mask is needed).
            rows, cols: `[N]` batch row and position of each loss position.

        Returns:
            `[N, V_out]` float32 logits for the token after each chosen position.
        """
        hidden = self.lm.model(input_ids=input_ids).last_hidden_state  # [B, T, H], final-normed
        picked = hidden[rows, cols]  # [N, H]
        rows_w = self.head_rows()
        return (picked @ rows_w.to(picked.dtype).T).float()


def set_trainable(model: SpeechLM, parts: tuple[str, ...] | list[str]) -> list[str]:
    """Freeze everything except `parts` (a subset of `PARTS`); returns the trainable names.

    Raises:
        ValueError: an unknown part, or only one of embeddings/head for a tied model (they are
            one tensor there).
    """
    parts = tuple(parts)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown trainable part(s) {unknown}; choose from {', '.join(PARTS)}")
    if model.tied and ("embeddings" in parts) != ("head" in parts):
        raise ValueError("this model ties its head to its embeddings (one tensor): make both "
                         "'embeddings' and 'head' trainable, or neither")
    names = []
    for name, param in model.lm.named_parameters():
        part = ("layers" if name.startswith("model.layers.") else
                "norm" if name == "model.norm.weight" else
                "embeddings" if name == "model.embed_tokens.weight" else
                "head" if name == "lm_head.weight" else None)
        if part is None:
            raise ValueError(f"parameter {name!r} belongs to no trainable part")
        param.requires_grad_(part in parts)
        if part in parts:
            names.append(name)
    if not names:
        raise ValueError(f"nothing to train: {parts} selects no parameters")
    return names


class _FusedLoss(torch.autograd.Function):
    """A loss over `[N, V_out]` draft logits whose forward saves the gradient it already formed."""

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None


class _ForwardKL(_FusedLoss):
    """KL(target || draft) summed over rows, with its gradient `(p_draft - p_target) / T` formed
    during the forward pass: a handful of in-place passes over `[N, V_out]` instead of
    autograd's chain through two log-softmaxes (the loss dominates a small model's step)."""

    @staticmethod
    def forward(ctx, draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float):
        target_logp = F.log_softmax(target_logits / temperature, dim=-1)
        draft_logp = F.log_softmax(draft_logits.detach() / temperature, dim=-1)
        target_probs = target_logp.exp()
        loss = target_logp.sub_(draft_logp).mul_(target_probs).sum()
        ctx.save_for_backward(draft_logp.exp_().sub_(target_probs).div_(temperature))
        return loss


def kd_loss_sum(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Forward KL(target || draft) of the temperature-softened distributions, summed over rows.

    Args:
        draft_logits, target_logits: `[N, V_out]` float32.
        temperature: the sampling temperature (the distributions speculative decoding compares).
    """
    return _ForwardKL.apply(draft_logits, target_logits.detach(), temperature)


class _TotalVariation(_FusedLoss):
    """TV(target, draft) = 1 - sum_x min(p(x), q(x)) summed over rows: one minus the exact-SD
    acceptance itself. With m = [p < q] (the tokens the draft under-proposes), its gradient in
    the draft logits is `-p * (m - sum_x p(x) m(x)) / T`, formed during the forward pass."""

    @staticmethod
    def forward(ctx, draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float):
        target_probs = torch.softmax(target_logits / temperature, dim=-1)
        draft_probs = torch.softmax(draft_logits.detach() / temperature, dim=-1)
        under = (draft_probs < target_probs).to(draft_probs.dtype)
        loss = draft_logits.shape[0] - torch.minimum(draft_probs, target_probs).sum()
        under_mass = (draft_probs * under).sum(dim=-1, keepdim=True)
        ctx.save_for_backward(under.sub_(under_mass).mul_(draft_probs).div_(-temperature))
        return loss


def tv_loss_sum(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Total variation between the temperature-softened distributions, summed over rows: the
    expected rejection of one exact-SD draft token, optimised directly.

    Args:
        draft_logits, target_logits: `[N, V_out]` float32.
        temperature: the sampling temperature.
    """
    return _TotalVariation.apply(draft_logits, target_logits.detach(), temperature)


# Losses against the target's logits (they need the teacher), by their `--loss` name.
TEACHER_LOSSES = {"kd": kd_loss_sum, "tv": tv_loss_sum}


def ce_loss_sum(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `[N]` output-space labels, summed over rows."""
    return F.cross_entropy(draft_logits, labels, reduction="sum")


@torch.no_grad()
def acceptance_sum(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sum over rows of `sum_x min(p(x), q(x)) = 1 - TV(p, q)`: the expected acceptance of one
    exact-SD draft token at that position (p draft, q target, both at `temperature`)."""
    draft_probs = torch.softmax(draft_logits / temperature, dim=-1)
    target_probs = torch.softmax(target_logits / temperature, dim=-1)
    return torch.minimum(draft_probs, target_probs).sum()
