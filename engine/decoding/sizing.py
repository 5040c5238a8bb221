"""How much GPU memory a job's worker takes and how fast its decode rounds can be at best, from
the checkpoints' config.json alone: no weights, no torch (the dry run's `engine.runtime.sizing`,
docs/sizing.md). Every figure is a projection.

Memory, as the engine allocates it:
- weights, in the models' dtype (`engine/models/llama.py`): the whole input embedding table, the
  head cut to the family's output ids (a tensor of its own even where the checkpoint ties it to
  the embeddings), every layer; the draft's beside the target's, each counted with its own tables
  (a draft made of the target's layers shares them where the values are equal: an upper bound);
  stream heads instead of a draft (`engine/models/streams.py`): their parameters in the target's
  dtype, and no cache;
- the decoder's static state (`engine/decoding/speculative.py`), preallocated per batch slot for
  the whole context: keys and values of every layer of target and draft for `context + gamma + 2`
  positions (a round may write gamma + 1 past the limit), the slot's token ids, an `ar` decoder's
  uniforms, the repetition-penalty mask and PCG's two fallback distributions (with stream heads:
  their states and the hidden state they came from);
- the codec's decode weights (`Family.codec_parameters`);
- allowances, which are assumptions, not measurements: what a round holds over the output ids
  (`VOCAB_BUFFERS` float32 copies of `[batch, gamma + 1, output ids]`), the activations of a
  batch of admissions prefilled at once (`PREFILL_TOKENS` prompt tokens a row), the codec's decode
  activations (`CODEC_WORKSPACE`) and the CUDA context, library workspaces and allocator slack
  (`FIXED`).

The round's floor: a decode round must at least read what it uses from memory once: the target's
weights once (its verify forward), the draft's gamma times (its steps) or stream heads' once
with the target's head again (their one pass and their proposals' logits), and each forward's
keys and values. Bytes read over the GPU's bandwidth (the vendor's data sheet) is a time no round can
beat; the sampling work over the output ids is not counted. The keys are read at the whole cache:
a round reads every slot up to the longest row's key bucket (`kv_bucket`), so it is the floor of
rounds whose batch holds a row near the end of its context; shorter rows read fewer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.families import Family

GB = 1e9  # decimal, as data sheets count memory
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
VOCAB_BUFFERS = 16  # float32 [batch, gamma + 1, output ids] buffers a round holds at once (an allowance)
PREFILL_TOKENS = 512  # prompt tokens a row is prefilled with (an allowance: a long text and a voice prompt)
ATTENTION_SCORES = 256 * 2**20  # float32 scores one prefill attention call holds (`GROUPED_SCORES_BYTES`)
CODEC_WORKSPACE = 2 * GB  # the codec's decode activations, its batches capped by max_batch_codes (an allowance)
FIXED = 2 * GB  # CUDA context, cuBLAS workspaces, CUDA-graph pools, allocator slack (an allowance)


@dataclass(frozen=True)
class GPU:
    """A GPU as its vendor's data sheet states it.

    Attributes:
        name: how `--gpu` and docs/sizing.md name it.
        memory_gb: memory in GB (10^9 bytes).
        bandwidth: peak memory bandwidth, bytes/s.
        device_name: what `torch.cuda.get_device_name` holds for it (`cost.spec_bandwidth`).
    """

    name: str
    memory_gb: float
    bandwidth: float
    device_name: str


# Vendor data sheets (NVIDIA). Ordered so that a device name meets its own entry before a shorter
# one it contains ("H100 NVL" before "H100", "L40" before "L4", "A100" before "A10").
GPUS: tuple[GPU, ...] = (
    GPU("H200", 141, 4.8e12, "H200"),
    GPU("H100 NVL", 94, 3.9e12, "H100 NVL"),
    GPU("H100 PCIe", 80, 2.0e12, "H100 PCIe"),
    GPU("H100", 80, 3.35e12, "H100"),  # SXM
    GPU("A100-80GB", 80, 2.039e12, "A100-SXM4-80GB"),
    GPU("A100-80GB PCIe", 80, 1.935e12, "A100 80GB PCIe"),
    GPU("A100-40GB", 40, 1.555e12, "A100"),
    GPU("L40S", 48, 0.864e12, "L40S"),
    GPU("L40", 48, 0.864e12, "L40"),
    GPU("L4", 24, 0.3e12, "L4"),
    GPU("A10G", 24, 0.6e12, "A10G"),
    GPU("A10", 24, 0.6e12, "A10"),
    GPU("RTX 4090", 24, 1.008e12, "RTX 4090"),
    GPU("V100", 16, 0.9e12, "V100"),
    GPU("T4", 16, 0.32e12, "T4"),
)


def gpu_of_device(device_name: str) -> GPU | None:
    """The data sheet of a device `torch.cuda.get_device_name` names (None: not a known one)."""
    return next((gpu for gpu in GPUS if gpu.device_name in device_name), None)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def gpu_named(name: str) -> GPU:
    """The GPU `name` names (case, spaces and hyphens aside: `h100`, `a100-40gb`, `RTX4090`).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    for gpu in GPUS:
        if _key(gpu.name) == _key(name):
            return gpu
    raise ValueError(f"--gpu {name!r}: not a GPU the sizing knows; choose one of "
                     + ", ".join(g.name for g in GPUS))


@dataclass(frozen=True)
class LMSize:
    """The dimensions of a Llama checkpoint that decide its memory (as `LlamaShape.from_config`
    reads them). `tie_word_embeddings` decides nothing here: the engine keeps a head of its own,
    cut to the output ids, either way."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: dict) -> LMSize:
        heads = config["num_attention_heads"]
        return cls(hidden=config["hidden_size"], intermediate=config["intermediate_size"],
                   layers=config["num_hidden_layers"], heads=heads,
                   kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads, vocab=config["vocab_size"],
                   attention_bias=bool(config.get("attention_bias", False)),
                   mlp_bias=bool(config.get("mlp_bias", False)))

    def layer_parameters(self) -> int:
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv + h if self.attention_bias else 0)
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        return attention + mlp + 2 * h  # and the two norms

    def step_parameters(self, output_ids: int) -> int:
        """What one decode step reads: every weight but the embedding table, of which only the
        fed tokens' rows are gathered (`LlamaLM.step_weight_bytes`)."""
        return self.layers * self.layer_parameters() + self.hidden + output_ids * self.hidden

    def parameters(self, output_ids: int) -> int:
        """Every weight as loaded: the embedding table, the layers, the final norm, the head."""
        return self.vocab * self.hidden + self.step_parameters(output_ids)

    def kv_per_position(self, dtype_bytes: int) -> int:
        """Bytes of keys and values one position of one row takes, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class StreamsSize:
    """Stream heads as their record (`pcg_streams.json`) states them: a drafter on the target's
    hidden states. Heads that attend (LLaSA+'s modules: a decoder layer each, in the target's
    attention shape) keep a cache of their own, one layer's keys and values a head; the others
    keep none.

    Attributes:
        attends: the heads keep keys and values (a layer of the target's shape each).
    """

    parameters: int
    heads: int
    hidden: int
    attends: bool = False

    @classmethod
    def from_info(cls, info: dict) -> StreamsSize:
        shape = info["shape"]
        return cls(parameters=info["parameters"], heads=shape["heads"], hidden=shape["hidden_size"],
                   attends=info.get("form", "streams") == "llasa_plus")

    def kv_per_position(self, target: LMSize, dtype_bytes: int) -> int:
        """Bytes of the heads' keys and values one position of one row takes (0: they keep none)."""
        return self.heads * target.kv_per_position(dtype_bytes) // target.layers if self.attends else 0


@dataclass(frozen=True)
class Worker:
    """What sizes one synthesis worker: its family, models, batch, draft length and dtype.

    Attributes:
        gamma: the draft length memory is sized for (0: `ar`, no draft).
        streams: stream heads that draft instead of `draft` (None: none).
    """

    family: Family
    target: LMSize
    draft: LMSize | None
    batch: int
    gamma: int
    dtype: str = "bfloat16"
    streams: StreamsSize | None = None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def positions(self) -> int:
        """Positions the decoder allocates a slot (`SpeculativeDecoder.cache_len`)."""
        return self.family.context + self.gamma + 2

    @property
    def loaded(self) -> list[LMSize]:
        """The models a worker loads (a job names a draft: it is loaded, even for `ar`)."""
        return [self.target] + ([self.draft] if self.draft is not None else [])

    @property
    def decoding(self) -> list[LMSize]:
        """The models the decoder runs, each with its caches (`ar`: the target alone)."""
        return self.loaded if self.gamma else [self.target]

    def weights(self, lm: LMSize) -> int:
        return lm.parameters(self.family.output_ids) * self.dtype_bytes

    def streams_weights(self) -> int:
        """The stream heads' weights, loaded in the target's dtype (0: none)."""
        return self.streams.parameters * self.dtype_bytes if self.streams is not None else 0

    def codec(self) -> int:
        held, wide = self.family.codec_parameters
        return held * self.dtype_bytes + wide * 4

    def kv_per_row(self) -> int:
        """Keys and values of one slot, target and draft (or heads that attend), for the whole
        context."""
        per_position = sum(lm.kv_per_position(self.dtype_bytes) for lm in self.decoding)
        return (per_position + self.streams_kv_per_position()) * self.positions

    def streams_kv_per_position(self) -> int:
        """The stream heads' keys and values per position of a row (0: none, or `ar`)."""
        if self.streams is None or not self.gamma:
            return 0
        return self.streams.kv_per_position(self.target, self.dtype_bytes)

    def state_per_row(self) -> int:
        """A slot's other preallocated tensors: token ids (int64), an `ar` decoder's uniforms
        (float64), the repetition-penalty mask (bool) and PCG's fallback distributions (two
        float32), each over the output ids; with stream heads, their states and the hidden state
        they came from."""
        ids = self.family.output_ids
        heads = (self.streams.heads + 1) * self.streams.hidden * self.dtype_bytes if self.streams and self.gamma else 0
        return 8 * self.positions * (1 if self.gamma else 2) + ids + (8 * ids if self.gamma else 0) + heads

    def buffers_per_row(self) -> int:
        """A slot's share of the allowances: the round's buffers over the output ids and its
        prompt's prefill activations (the wider of the two models; they prefill in turn)."""
        lm = max(self.decoding, key=lambda m: 3 * m.intermediate + 4 * m.hidden)
        prefill = PREFILL_TOKENS * (3 * lm.intermediate + 4 * lm.hidden) * self.dtype_bytes
        return VOCAB_BUFFERS * (self.gamma + 1) * self.family.output_ids * 4 + prefill

    def per_row(self) -> int:
        return self.kv_per_row() + self.state_per_row() + self.buffers_per_row()

    def allowances(self) -> int:
        return ATTENTION_SCORES + CODEC_WORKSPACE + FIXED

    def base(self) -> int:
        """Bytes a worker takes before its first row: weights, codec and the fixed allowances."""
        return (sum(self.weights(lm) for lm in self.loaded) + self.streams_weights() + self.codec()
                + self.allowances())

    def total(self) -> int:
        return self.base() + self.batch * self.per_row()

    def largest_batch(self, memory_gb: float) -> int:
        """The most rows whose worker fits `memory_gb` (0: not even one)."""
        return max(0, int((memory_gb * GB - self.base()) // self.per_row()))

    def round_bytes(self, gamma: int | None = None) -> int:
        """Bytes one decode round reads at `gamma` (default: the worker's) with every slot's keys
        read at the whole cache: the target's weights and keys once, the draft's gamma times;
        stream heads' weights once (and their keys, for heads that attend), and the target's head
        once more (their proposals' logits)."""
        gamma = self.gamma if gamma is None else gamma
        ids, b, keys = self.family.output_ids, self.dtype_bytes, self.batch * self.positions
        total = self.target.step_parameters(ids) * b + self.target.kv_per_position(b) * keys
        if gamma and self.draft is not None:
            total += gamma * (self.draft.step_parameters(ids) * b + self.draft.kv_per_position(b) * keys)
        if gamma and self.streams is not None:
            total += (self.streams.parameters + ids * self.target.hidden) * b
            total += self.streams.kv_per_position(self.target, b) * keys
        return total


@dataclass(frozen=True)
class Speed:
    """The memory-bound floor of a worker's rounds on a GPU, and the most audio it allows.

    Attributes:
        round_s: seconds a round takes at least.
        tokens_per_round: codes a row gains a round (gamma + 1: every draft accepted; 1 for `ar`).
        audio_per_hour: hours of audio a worker makes in an hour at most.
    """

    gpu: GPU
    gamma: int
    round_s: float
    tokens_per_round: float
    audio_per_hour: float


def speed(worker: Worker, gpu: GPU, gamma: int | None = None, tokens_per_round: float | None = None,
          share: float = 1.0) -> Speed:
    """The floor of `worker`'s rounds on `gpu` at `gamma` (0: `ar`), holding `share` of its
    bandwidth (two workers on one GPU: 0.5 each). `tokens_per_round`: a row's codes a round, by
    default the bound gamma + 1 (a measured mean accepted length is smaller)."""
    gamma = worker.gamma if gamma is None else gamma
    tokens = float(gamma + 1) if tokens_per_round is None else tokens_per_round
    round_s = worker.round_bytes(gamma) / (gpu.bandwidth * share)
    codes_per_s = worker.batch * tokens / round_s
    return Speed(gpu, gamma, round_s, tokens, codes_per_s / worker.family.codes_per_second)


def job_hours(audio_hours: float, rate: Speed, workers: int) -> float:
    """Hours `workers` need at least for `audio_hours` of audio at `rate` each."""
    return audio_hours / (rate.audio_per_hour * workers)
