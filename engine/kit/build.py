"""The tiny model kit: a complete, small, deterministic model set of one family (Llasa, the
default, or Orpheus).

`pcg-synth kit build [--family orpheus] DIR` writes
    DIR/target/  Llama causal LM (HF config + safetensors + tokenizer) in the family's token
                 layout, tied embeddings
    DIR/draft/   a subset of the target's layers (the paper's recipe), distilled on target
                 samples by `engine.draft` (the path `pcg-synth draft init/train` takes)
    DIR/streams/ stream heads on the target (`engine.models.streams`), distilled on the same
                 samples by `engine.draft.streams` (the path `pcg-synth draft train --kind streams` takes)
    DIR/codec/   a small random codec: X-codec2 (transformers `Xcodec2Model`) for Llasa, SNAC
                 24 kHz (the `snac` package) for Orpheus
    DIR/kit.json what was built, from which seed, with a content hash

The weights are random but shaped so the kit behaves like a speech LM where it matters for
speculative decoding: speech-token embeddings form acoustic-similarity clusters (so PCG's
groups are non-trivial), the head is tied to them (so the target spreads mass over similar
tokens), the target's distributions are peaked (standard SD acceptance is neither ~0 nor ~1),
and the end-of-speech token has a calibrated per-step probability (utterances end).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.families import family_named
from engine.families.base import SpeechLayout
from engine.families.llasa import NUM_SPEECH_TOKENS
from engine.hf import from_transformers
from engine.kit.draft import KitDraftRecipe, KitStreamsRecipe, build_kit_draft, build_kit_streams, kit_samples
from engine.kit.tokenizer import build_tokenizer

# 2: the draft is distilled, not the bare layer subset; 3: a family (kit.json `family`); 4: stream heads
KIT_VERSION = 4


@dataclass(frozen=True)
class KitSpec:
    """Knobs of the tiny kit. Defaults are what tests, quickstart and benchmarks use."""

    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    draft_layers: tuple[int, ...] = (0, 1, 3)
    draft_training: KitDraftRecipe = field(default_factory=KitDraftRecipe)  # KD of the draft
    streams_training: KitStreamsRecipe = field(default_factory=KitStreamsRecipe)  # KD of the stream heads
    text_vocab_size: int = 1024
    num_clusters: int = 4096  # acoustic clusters over the 65,536 speech tokens
    cluster_cosine: float = 0.6  # expected cosine between two tokens of one cluster
    embed_norm: float = 1.0
    # Measured on seed 0 (8 texts x 64 sampled tokens, temperature 0.8): target entropy ~6.8
    # nats of 11.1, draft/target 1 - TV ~0.32 per token and ~0.40 per group at theta 0.4.
    # layer_std 0.04 collapses into repeating the current token; logit_scale <= 1.5 is
    # near-uniform, >= 3 collapses.
    layer_std: float = 0.08  # weight std of attention/MLP projections
    logit_scale: float = 2.5  # final-norm gain: how peaked the target is
    eos_rate: float = 0.01  # mean per-step end-of-speech probability at temperature 0.8
    max_position_embeddings: int = 131072  # as Llama-3.2; Llasa itself is trained to 2048
    codec: dict = field(default_factory=lambda: {"hidden_size": 64, "layers": 2})


def llama_config(spec: KitSpec, vocab_size: int, num_layers: int, layout: SpeechLayout) -> dict:
    head_dim = spec.hidden_size // spec.num_heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "bos_token_id": 0,
        "eos_token_id": layout.eos_token,
        "torch_dtype": "float32",
    }


def speech_embeddings(spec: KitSpec, dim: int, gen: torch.Generator, layout: SpeechLayout) -> torch.Tensor:
    """`[codes, dim]` rows in clusters with intra-cluster cosine ~ `cluster_cosine`: `num_clusters`
    over one range of 65,536 codes, as many tokens a cluster within each range of a framed layout
    (a cluster never spans two frame positions, as their codes mean different things).

    Per-token noise levels vary, so group sizes at a fixed theta vary too (some singletons).
    """
    n = layout.num_codes
    per_range = spec.num_clusters if layout.cycle == 1 else max(1, layout.codebook * spec.num_clusters
                                                                // NUM_SPEECH_TOKENS)
    centres = torch.randn(per_range * layout.cycle, dim, generator=gen)
    centres = centres / centres.norm(dim=-1, keepdim=True)
    cluster = torch.randint(0, per_range, (n,), generator=gen) + per_range * (torch.arange(n) // layout.codebook)
    noise = torch.randn(n, dim, generator=gen) / math.sqrt(dim)
    # cos(a, b) ~ 1 / (1 + s^2) for two members with noise scale s around a unit centre.
    base = math.sqrt(1.0 / spec.cluster_cosine - 1.0)
    spread = base * torch.exp(0.35 * torch.randn(n, 1, generator=gen))
    rows = centres[cluster] + spread * noise
    return spec.embed_norm * rows / rows.norm(dim=-1, keepdim=True)


def random_llama(spec: KitSpec, config: dict, gen: torch.Generator, layout: SpeechLayout) -> dict:
    """HF-named tensors of the kit target."""
    h, inter = spec.hidden_size, spec.intermediate_size
    hd = config["head_dim"]
    vocab = config["vocab_size"]
    embed = torch.randn(vocab, h, generator=gen) * (spec.embed_norm / math.sqrt(h))
    speech = slice(layout.first_code, layout.first_code + layout.num_codes)
    embed[speech] = speech_embeddings(spec, h, gen, layout)
    tensors = {"model.embed_tokens.weight": embed}

    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * spec.layer_std

    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = w(spec.num_heads * hd, h)
        tensors[p + "self_attn.k_proj.weight"] = w(spec.num_kv_heads * hd, h)
        tensors[p + "self_attn.v_proj.weight"] = w(spec.num_kv_heads * hd, h)
        tensors[p + "self_attn.o_proj.weight"] = w(h, spec.num_heads * hd)
        tensors[p + "mlp.gate_proj.weight"] = w(inter, h)
        tensors[p + "mlp.up_proj.weight"] = w(inter, h)
        tensors[p + "mlp.down_proj.weight"] = w(h, inter)
        tensors[p + "input_layernorm.weight"] = torch.ones(h)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(h)
    tensors["model.norm.weight"] = torch.full((h,), spec.logit_scale)
    return tensors


def layer_subset(tensors: dict, layers: tuple[int, ...]) -> dict:
    """A draft's tensors: the chosen target layers renumbered, plus embeddings and final norm."""
    out = {k: v for k, v in tensors.items() if not k.startswith("model.layers.")}
    for new, old in enumerate(layers):
        prefix = f"model.layers.{old}."
        for k, v in tensors.items():
            if k.startswith(prefix):
                out[f"model.layers.{new}." + k[len(prefix):]] = v
    return out


def save_checkpoint(out: Path, config: dict, tensors: dict, tokenizer_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)


def kit_hash(out: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(out.rglob("*")):
        if f.is_file() and f.name != "kit.json":
            digest.update(str(f.relative_to(out)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()


CALIBRATION_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding accepts draft tokens that the target would also choose.",
    "Please call Stella and ask her to bring these things.",
    "It was the best of times, it was the worst of times.",
    "Numbers like one, two and three appear in many sentences.",
    "In the beginning the weather was cold.",
    "How much wood would a woodchuck chuck?",
    "Hong Kong, London and Paris are large cities.",
]


def calibrate_eos(spec: KitSpec, target_dir: Path, tensors: dict, layout: SpeechLayout) -> float:
    """Set the end-of-speech row (tied: input embedding = head row) to `a * d`, `d` the mean
    final hidden direction, with `a` chosen so the mean per-step end probability at temperature
    0.8 on sampled speech is `spec.eos_rate`. Returns `a`."""
    from engine.api import Synthesizer
    from engine.config import DecodingSettings

    synth = Synthesizer.load(target_dir, device="cpu", dtype="float32", batch_size=8)
    settings = DecodingSettings(method="ar", temperature=0.8, max_new_tokens=96, seed=spec.seed)
    results, _ = synth.synthesize(CALIBRATION_TEXTS, settings)
    model, t = synth.target.model, 0.8
    hidden, logits = [], []
    for text, res in zip(CALIBRATION_TEXTS, results):
        ids = synth.prompter.build(text) + layout.token_ids(res.codes)
        tokens = torch.tensor([ids])
        pos = torch.arange(len(ids))[None]
        cache = model.new_cache(1, len(ids) + 1)
        h = model(tokens, pos, cache, len(ids), logits_at="hidden")[0, -len(res.codes):]
        hidden.append(h)
        logits.append(h @ model.head[: layout.num_codes].T)
    hidden, logits = torch.cat(hidden), torch.cat(logits)
    direction = hidden.mean(0)
    direction = direction / direction.norm()
    proj = hidden @ direction / t  # [N]
    rest = torch.logsumexp(logits / t, dim=-1)  # [N]
    lo, hi = 0.0, 1000.0
    for _ in range(60):
        a = (lo + hi) / 2
        rate = torch.sigmoid(a * proj - rest).mean().item()
        lo, hi = (a, hi) if rate < spec.eos_rate else (lo, a)
    tensors["model.embed_tokens.weight"][layout.eos_token] = lo * direction
    return lo


def build_codec(out: Path, spec: KitSpec, family: str = "llasa") -> None:
    """A small random codec of the family: X-codec2 in transformers' format, or SNAC 24 kHz in the
    `snac` package's (decoder shapes as the real ones, tiny)."""
    if family == "orpheus":
        from engine.kit.codec import TINY_SNAC_CONFIG, write_random_snac

        write_random_snac(out, TINY_SNAC_CONFIG, spec.seed)
        return
    Xcodec2Config, Xcodec2Model = from_transformers("Xcodec2Config"), from_transformers("Xcodec2Model")

    h, n_layers = spec.codec["hidden_size"], spec.codec["layers"]
    semantic = {"model_type": "wav2vec2-bert", "hidden_size": h, "num_hidden_layers": n_layers,
                "num_attention_heads": 2, "intermediate_size": 2 * h, "output_hidden_size": h}
    config = Xcodec2Config(hidden_size=h, intermediate_size=2 * h, num_hidden_layers=n_layers,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=h // 2,
                           quantization_dim=2 * h, encoder_hidden_size=8,
                           semantic_model_config=semantic)
    from engine.kit.codec import spread_codes

    torch.manual_seed(spec.seed)
    model = Xcodec2Model(config).eval()
    spread_codes(model)  # random encoders otherwise map every clip to one code
    model.save_pretrained(str(out))


def build_kit(out_dir: str | Path, spec: KitSpec | None = None, force: bool = False, family: str = "llasa") -> Path:
    """Write the kit of `family` (`llasa` or `orpheus`) to `out_dir` (deterministic for a given
    spec and library versions).

    Raises:
        FileExistsError: `out_dir` holds files and `force` is not set.
        UnknownFamily: another family.
    """
    fam = family_named(family)
    spec = spec or KitSpec()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out} is not empty; pass force=True (--force) to rebuild")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / ".tokenizer"
    tokenizer = build_tokenizer(tok_dir, spec.text_vocab_size, fam.name)
    layout = fam.layout(tokenizer)
    gen = torch.Generator().manual_seed(spec.seed)
    target_cfg = llama_config(spec, len(tokenizer), spec.num_layers, layout)
    tensors = random_llama(spec, target_cfg, gen, layout)
    save_checkpoint(out / "target", target_cfg, tensors, tok_dir)
    eos_scale = calibrate_eos(spec, out / "target", tensors, layout)
    save_checkpoint(out / "target", target_cfg, tensors, tok_dir)
    seqs = kit_samples(out / "target", spec.draft_training, spec.seed)
    draft_training = build_kit_draft(out / "target", out / "draft", spec.draft_layers,
                                     spec.draft_training, spec.seed, seqs)
    streams_training = build_kit_streams(out / "target", out / "streams", spec.streams_training,
                                         spec.draft_training.temperature, spec.seed, seqs)
    build_codec(out / "codec", spec, fam.name)
    shutil.rmtree(tok_dir)
    manifest = {"kit_version": KIT_VERSION, "family": fam.name, "spec": asdict(spec), "eos_scale": eos_scale,
                "draft_training": draft_training, "streams_training": streams_training, "layout": layout.to_dict(),
                "sha256": kit_hash(out)}
    (out / "kit.json").write_text(json.dumps(manifest, indent=2))
    return out
