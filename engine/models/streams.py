"""Stream heads: a drafter made of small modules on the target's own last hidden state.

A speculative round needs, for each proposed position, a distribution to sample the proposal
from; any distribution keeps every acceptance rule exact. Stream heads give them without a draft
model: after a round has verified its block, the target's final-normed hidden state `h_j` at the
last accepted position and the token `x_{j+1}` it was followed by (the round's bonus or recovered
token) go through

    z_0 = proj([norm_h(h_j), norm_e(E[x_{j+1}])])        E: the target's input embeddings
    z_k = z_{k-1} + mlp_k(norm_k(z_{k-1}))                k = 1..heads

and head `k` proposes `x_{j+1+k}` from `target.head(target.norm(z_k))` (the target's own output
head). The next round samples its `gamma <= heads` proposals from those logits and verifies them
in its one target forward, whose hidden states feed the heads again: a round is one target
forward plus the heads, with no draft model and no draft cache.

The heads see the token that follows `h_j` (as a one-layer draft does), not the proposals before
theirs: head `k > 1` guesses from `z_{k-1}`, which is what keeps a round to one pass of the heads.
Parameter names are this module's; a checkpoint is the heads only (`streams.safetensors` beside
`pcg_streams.json`), loaded onto a target whose hidden size and output ids match.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.io.storage import STREAMS_INFO  # the heads' record: what they are, which target they were made for

STREAMS_WEIGHTS = "streams.safetensors"
STREAMS_FORMAT = 1


@dataclass(frozen=True)
class StreamShape:
    """The heads' dimensions.

    Attributes:
        hidden_size: the target's hidden size (the heads read and write vectors of it).
        heads: proposals per round at most (a job's gamma may be smaller).
        intermediate_size: each head's MLP width.
        rms_norm_eps: the norms' epsilon (the target's).
    """

    hidden_size: int
    heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.heads < 1 or self.hidden_size < 1 or self.intermediate_size < 1:
            raise ValueError(f"stream heads need at least one head and positive sizes; got {self}")


class StreamMLP(nn.Module):
    """One head's residual block: a gated MLP as the target's layers have."""

    def __init__(self, shape: StreamShape) -> None:
        super().__init__()
        h, i = shape.hidden_size, shape.intermediate_size
        self.norm = nn.RMSNorm(h, eps=shape.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * i, bias=False)
        self.down = nn.Linear(i, h, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.norm(z)).chunk(2, dim=-1)
        return z + self.down(F.silu(gate) * up)


class StreamHeads(nn.Module):
    """The heads (see the module docstring). `chain(h, e)` maps the target's normed hidden
    states `[..., H]` and the embeddings of the tokens that follow them `[..., H]` to the heads'
    states `[..., heads, H]`; `logits(target, states)` turns states into the target's output
    logits."""

    def __init__(self, shape: StreamShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.norm_hidden = nn.RMSNorm(h, eps=shape.rms_norm_eps)
        self.norm_token = nn.RMSNorm(h, eps=shape.rms_norm_eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.blocks = nn.ModuleList(StreamMLP(shape) for _ in range(shape.heads))

    @property
    def heads(self) -> int:
        return self.shape.heads

    @property
    def dtype(self) -> torch.dtype:
        return self.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def step_weight_bytes(self) -> int:
        """Bytes of weights one pass of the heads reads."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def chain(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """The heads' states `[..., heads, H]` from normed hidden states and next-token embeddings."""
        hidden, embedded = hidden.to(self.dtype), embedded.to(self.dtype)
        z = self.proj(torch.cat([self.norm_hidden(hidden), self.norm_token(embedded)], -1))
        states = []
        for block in self.blocks:
            z = block(z)
            states.append(z)
        return torch.stack(states, -2)

    def follow(self, target, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """`chain` of `hidden` `[..., H]` and the vocabulary ids `tokens` `[...]` that follow them,
        embedded by `target`."""
        return self.chain(hidden, target.model.embed_tokens(tokens))

    @staticmethod
    def logits(target, states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """The target's output logits `[..., V_out]` of head states `[..., H]` (its final norm and
        head, as for its own hidden states)."""
        return target.project(target.model.norm(states.to(target.dtype)), widen=widen)

    def fits(self, target) -> None:
        """Raise unless these heads can run on `target` (its hidden size)."""
        if self.shape.hidden_size != target.shape.hidden_size:
            raise ValueError(f"stream heads of hidden size {self.shape.hidden_size} cannot run on a target of "
                             f"hidden size {target.shape.hidden_size}")


def stream_shape_for(target_shape, heads: int, intermediate_size: int | None = None) -> StreamShape:
    """Heads for a target of `target_shape` (`LlamaShape`): its hidden size and norm epsilon; the
    MLP width defaults to the hidden size (about `3 * H^2` weights a head)."""
    return StreamShape(hidden_size=target_shape.hidden_size, heads=heads,
                       intermediate_size=intermediate_size or target_shape.hidden_size,
                       rms_norm_eps=target_shape.rms_norm_eps)


def is_streams_dir(path: str | Path) -> bool:
    """Whether `path` is a directory of stream heads (not a draft model)."""
    return (Path(path) / STREAMS_INFO).is_file()


def save_streams(out: str | Path, heads: StreamHeads, target: dict, record: dict | None = None) -> Path:
    """Write `heads` to the directory `out` (created): weights and `pcg_streams.json` with their
    shape, what they were made for (`target`: its hidden size, output ids, name) and `record`
    (how they were trained)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in heads.state_dict().items()}
    save_file(tensors, str(out / STREAMS_WEIGHTS), metadata={"format": "pt"})
    info = {"kind": "streams", "format": STREAMS_FORMAT, "shape": asdict(heads.shape), "target": target,
            "parameters": heads.num_parameters(), "trained": record or {}}
    (out / STREAMS_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return out


def read_streams_info(path: str | Path) -> dict:
    """`pcg_streams.json` of a heads directory, checked for its format."""
    path = Path(path)
    try:
        info = json.loads((path / STREAMS_INFO).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} holds no stream heads ({STREAMS_INFO} is missing)") from None
    if info.get("kind") != "streams" or info.get("format") != STREAMS_FORMAT:
        raise ValueError(f"{path / STREAMS_INFO} is not a format-{STREAMS_FORMAT} stream heads record")
    return info


def load_streams(path: str | Path, target, dtype: torch.dtype | None = None) -> StreamHeads:
    """The heads stored at `path`, on `target`'s device in `dtype` (default: the target's).

    Raises:
        ValueError: the heads were made for another target shape or output space.
    """
    from safetensors.torch import load_file

    path = Path(path)
    info = read_streams_info(path)
    shape = StreamShape(**info["shape"])
    made_for = info.get("target", {})
    if made_for.get("vocab_out") not in (None, target.vocab_out):
        raise ValueError(f"stream heads {path} were made for a target of {made_for['vocab_out']} output ids; "
                         f"this target has {target.vocab_out}")
    with torch.device("meta"):
        heads = StreamHeads(shape)
    heads = heads.to_empty(device=target.device)
    heads.load_state_dict(load_file(str(path / STREAMS_WEIGHTS), device=str(target.device)))
    heads.fits(target)
    heads = heads.to(dtype or target.dtype).eval().requires_grad_(False)
    heads.path = path
    heads.info = info
    return heads
