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
from engine.models.kv_cache import KVCache

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


class Heads(nn.Module):
    """What a round asks of a heads drafter, whatever its form.

    Attributes:
        attends: the heads attend over earlier positions (their own KV cache, filled at every
            committed position: `states`); else they read one position only (`follow`).
        token_input: the heads read the token after the hidden state too (a row whose token is
            drawn after the round has its states redone then).
    """

    attends = False
    token_input = True
    form = "streams"

    @property
    def heads(self) -> int:
        return self.shape.heads

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def step_weight_bytes(self) -> int:
        """Bytes of weights one pass of the heads reads."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def new_cache(self, target, batch: int, max_len: int) -> KVCache | None:
        """The heads' own KV cache (None: they attend to nothing)."""
        return None

    def fits(self, target) -> None:
        """Raise unless these heads can run on `target` (its hidden size)."""
        if self.shape.hidden_size != target.shape.hidden_size:
            raise ValueError(f"stream heads of hidden size {self.shape.hidden_size} cannot run on a target of "
                             f"hidden size {target.shape.hidden_size}")


class StreamHeads(Heads):
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


class LlasaPlusHeads(Heads):
    """LLaSA+'s multi-token modules as heads (ASLP-lab/LLaSA_Plus): module `k` normalises the
    previous module's output (the target's final-normed hidden state for the first), projects it
    (a linear layer with bias) and runs a full Llama decoder layer over it, attending causally to
    the same module's inputs at every earlier position; its output goes through the target's head
    without the final norm. Module `k` at position `j` proposes `x_{j+1+k}`. No token input: a
    row's states depend on the target's hidden states only."""

    attends = True
    token_input = False
    form = "llasa_plus"

    def __init__(self, shape: StreamShape, layer_shape) -> None:
        from engine.models.llama import DecoderLayer, RMSNorm

        super().__init__()
        self.shape, self.layer_shape = shape, layer_shape
        h = shape.hidden_size
        self.norms = nn.ModuleList(RMSNorm(h, shape.rms_norm_eps) for _ in range(shape.heads))
        self.projs = nn.ModuleList(nn.Linear(h, h, bias=True) for _ in range(shape.heads))
        self.blocks = nn.ModuleList(DecoderLayer(layer_shape) for _ in range(shape.heads))

    def new_cache(self, target, batch: int, max_len: int) -> KVCache:
        s = self.layer_shape
        return KVCache(self.heads, batch, s.num_kv_heads, max_len, s.head_dim, self.dtype, target.device)

    def states(self, target, normed: torch.Tensor, positions: torch.Tensor, cache: KVCache, kv_len: int,
               slots: torch.Tensor | None = None) -> torch.Tensor:
        """The heads' states `[b, T, heads, H]` at `positions` `[b, T]` from the target's normed
        hidden states there `[b, T, H]`, each module's keys and values written into `cache`
        (rows `slots`, as `LlamaLM.step` writes)."""
        from engine.models.attention import fold_mask

        tables = target.step_tables(positions, kv_len)
        kind = target.attention_kind(positions)
        if kind == "folded":
            s = self.layer_shape
            tables = tables._replace(mask=fold_mask(tables.mask, s.num_heads // s.num_kv_heads))
        rows = cache.rows if slots is None else slots[:, None]
        z, out = normed.to(self.dtype), []
        for k in range(self.heads):
            z = self.blocks[k](self.projs[k](self.norms[k](z)), tables, cache, k, slots, rows, positions, kind)
            out.append(z)
        return torch.stack(out, -2)

    def follow(self, target, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One position of the heads `[b, heads, H]` attending to itself only (what a pass costs
        beside its context: the cost model's timing); `tokens` are not read."""
        b = hidden.shape[0]
        cache = self.new_cache(target, b, 1)
        return self.states(target, hidden[:, None], torch.zeros(b, 1, dtype=torch.long, device=hidden.device),
                           cache, 1)[:, 0]

    @staticmethod
    def logits(target, states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """The target's head on the modules' outputs as they are (LLaSA+ applies no final norm)."""
        return target.project(states.to(target.dtype), widen=widen)


# LLaSA+'s parameter names for module k (1-based) -> these heads' names for module k - 1
LLASA_PLUS_NAMES = (("mtp_{k}_local_RMSNorm.", "norms.{i}."), ("mtp_{k}_proj.", "projs.{i}."),
                    ("mtp_{k}_block.", "blocks.{i}."))


def llasa_plus_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The modules' tensors of a LLaSA+ checkpoint (`mtp_<k>_*`), renamed for `LlasaPlusHeads`;
    everything else (the backbone `llm.*`) is left out.

    Raises:
        ValueError: the checkpoint holds no modules, or their numbering has gaps.
    """
    found = sorted({int(name.split("_")[1]) for name in tensors if name.startswith("mtp_")})
    if not found or found != list(range(1, len(found) + 1)):
        raise ValueError(f"no LLaSA+ multi-token modules mtp_1.. in this checkpoint (found {found})")
    out = {}
    for name, tensor in tensors.items():
        for theirs, ours in LLASA_PLUS_NAMES:
            k = name.split("_")[1] if name.startswith("mtp_") else None
            prefix = theirs.format(k=k)
            if k is not None and name.startswith(prefix):
                out[ours.format(i=int(k) - 1) + name[len(prefix):]] = tensor
    return out


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
    info = {"kind": "streams", "format": STREAMS_FORMAT, "form": heads.form, "shape": asdict(heads.shape),
            "target": target, "parameters": heads.num_parameters(), "trained": record or {}}
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


def load_streams(path: str | Path, target, dtype: torch.dtype | None = None) -> Heads:
    """The heads stored at `path` (`StreamHeads`, or `LlasaPlusHeads` whose decoder layers take
    the target's attention shape), on `target`'s device in `dtype` (default: the target's).

    Raises:
        ValueError: the heads were made for another target shape or output space, or are of an
            unknown form.
    """
    from safetensors.torch import load_file

    path = Path(path)
    info = read_streams_info(path)
    shape = StreamShape(**info["shape"])
    made_for = info.get("target", {})
    if made_for.get("vocab_out") not in (None, target.vocab_out):
        raise ValueError(f"stream heads {path} were made for a target of {made_for['vocab_out']} output ids; "
                         f"this target has {target.vocab_out}")
    form = info.get("form", "streams")
    if form not in ("streams", "llasa_plus"):
        raise ValueError(f"{path / STREAMS_INFO}: unknown form {form!r} (streams or llasa_plus)")
    heads_of = (lambda: StreamHeads(shape)) if form == "streams" else (lambda: LlasaPlusHeads(shape, target.shape))
    with torch.device("meta"):
        heads = heads_of()
    heads = heads.to_empty(device=target.device)
    heads.load_state_dict(load_file(str(path / STREAMS_WEIGHTS), device=str(target.device)))
    heads.fits(target)
    heads = heads.to(dtype or target.dtype).eval().requires_grad_(False)
    heads.path = path
    heads.info = info
    return heads


def import_llasa_plus(checkpoint: str | Path, target, target_path: str | Path, out: str | Path) -> Path:
    """Write LLaSA+'s multi-token modules from `checkpoint` (its `model.safetensors`, or a directory
    holding it) as a heads directory at `out`, for `target` (a `LlamaLM` of the backbone they were
    trained on: its hidden size and attention shape). The backbone's own tensors (`llm.*`) are not
    copied: the target comes from its own checkpoint.

    Raises:
        ValueError: no modules in the checkpoint, or modules of another shape than the target's.
    """
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    files = sorted(checkpoint.glob("*.safetensors")) if checkpoint.is_dir() else [checkpoint]
    if not files:
        raise ValueError(f"{checkpoint}: no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update({k: v for k, v in load_file(str(f)).items() if k.startswith("mtp_")})
    renamed = llasa_plus_tensors(tensors)
    count = 1 + max(int(name.split(".")[1]) for name in renamed)
    hidden = renamed["projs.0.weight"].shape[0]
    if hidden != target.shape.hidden_size:
        raise ValueError(f"{checkpoint}: LLaSA+ modules of hidden size {hidden} cannot run on a target of hidden "
                         f"size {target.shape.hidden_size}")
    shape = StreamShape(hidden_size=hidden, heads=count,
                        intermediate_size=renamed["blocks.0.mlp.gate_proj.weight"].shape[0], rms_norm_eps=1e-6)
    with torch.device("meta"):
        heads = LlasaPlusHeads(shape, target.shape)
    heads = heads.to_empty(device="cpu")
    missing, unexpected = heads.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise ValueError(f"{checkpoint}: LLaSA+ modules do not match the target's layer shape "
                         f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    return save_streams(out, heads, {"path": str(target_path), "hidden_size": hidden, "vocab_out": target.vocab_out,
                                     "num_layers": target.shape.num_layers},
                        {"imported_from": str(checkpoint), "source": "ASLP-lab/LLaSA_Plus"})
