"""`draft eval`: how well drafts serve a target, measured by real speculative decoding.

For each draft and each acceptance rule, the held-out texts are decoded with the engine
(`Synthesizer`) and the mean accepted length (tokens per target call, bonus included) and the
acceptance at each draft position are reported. Same texts, seeds and settings for every draft,
so "before" (the untrained layer subset) and "after" (the distilled draft) compare directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.config import DecodingSettings
from engine.console import bar_disabled

# Held out from every training set this project builds (the kit's `KIT_TRAIN_TEXTS`).
HELDOUT_TEXTS = [
    "The weather report promised clear skies for the weekend.",
    "Please leave your shoes by the front door.",
    "A flock of starlings turned above the harbour.",
    "The engineer checked every bolt on the old bridge.",
    "Lunch will be served in the garden at noon.",
    "Two cats slept in a patch of warm sunlight.",
    "The final chapter of the novel surprised every reader.",
    "We drove along the coast until the road ran out.",
    "The pianist bowed twice and left the stage.",
    "Autumn leaves drifted across the empty playground.",
    "He forgot his umbrella on the crowded bus.",
    "The recipe calls for two eggs and a cup of flour.",
    "Quiet waves washed over the smooth grey stones.",
    "Her first speech at the council lasted ten minutes.",
    "The lamp in the attic flickered and went dark.",
    "Nobody expected the match to end in a draw.",
]
DEFAULT_METHODS = ("exact", "pcg")
EVAL_MAX_NEW_TOKENS = 128  # `draft eval`'s default: enough tokens per text to measure acceptance


@dataclass(frozen=True)
class ModelLoading:
    """How `evaluate_drafts` loads the target and every draft.

    Attributes:
        device: auto | cpu | cuda | cuda:N.
        dtype: auto | float32 | bfloat16 | float16 (both models).
        draft_weights: the drafts' weights, as `load_model`'s `weights`.
    """

    device: str = "auto"
    dtype: str = "auto"
    draft_weights: str = "native"


def read_texts(path: str | Path | None) -> list[str]:
    """One text per line from `path`, or the built-in held-out texts."""
    if path is None:
        return list(HELDOUT_TEXTS)
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--texts-file {p} does not exist")
    texts = [line.strip() for line in p.read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"--texts-file {p} holds no texts")
    return texts


def summarize(summary) -> dict:
    """The acceptance figures of one `synthesize` run."""
    s = summary.stats
    return {"mean_accepted_length": s.mean_accepted_length,
            "acceptance_per_position": s.acceptance_per_position,
            "acceptance": sum(s.accepted) / s.drafted if s.drafted else 0.0,
            "drafted": s.drafted, "accepted": sum(s.accepted), "target_calls": s.rounds,
            "generated_tokens": s.generated_tokens, "tokens_per_s": summary.tokens_per_s}


def evaluate_drafts(target: str | Path, drafts: Sequence[str | Path], texts: Sequence[str] | None = None,
                    methods: Sequence[str] = DEFAULT_METHODS, decoding: DecodingSettings | None = None,
                    loading: ModelLoading = ModelLoading(), batch_size: int = 8, progress: bool = False) -> dict:
    """Decode `texts` with each draft and method against `target`.

    Args:
        decoding: the decoding settings every run uses, its `method` replaced by each of
            `methods` (only the fields it was given are kept; None: the defaults with
            `EVAL_MAX_NEW_TOKENS` new tokens).
        loading: device, dtype and the drafts' weights.

    Returns:
        `{"settings": {...}, "drafts": {draft path: {method: figures}}}` (figures as in
        `summarize`).

    Raises:
        ValueError: a draft's vocabulary differs from the target's, or a bad setting.
    """
    from engine.api import Synthesizer
    from engine.draft.init import vocabulary_view
    from engine.models.device import resolve_device
    from engine.models.loading import load_model

    if decoding is None:
        decoding = DecodingSettings(max_new_tokens=EVAL_MAX_NEW_TOKENS)
    given = decoding.model_dump(exclude_unset=True)
    texts = list(texts) if texts is not None else list(HELDOUT_TEXTS)
    settings = {m: DecodingSettings(**{**given, "method": m}) for m in methods}
    device, dtype, draft_weights = str(resolve_device(loading.device)), loading.dtype, loading.draft_weights
    # Tokenizers via the content-keyed cache: a draft with the target's tokenizer files is not
    # loaded twice, and Synthesizer still compares the two vocabularies.
    tgt = load_model(target, device=device, dtype=dtype, tokenizer=vocabulary_view(target).tokenizer)
    out: dict = {"settings": {"methods": list(methods), "gamma": decoding.gamma, "theta": decoding.theta,
                              "temperature": decoding.temperature, "max_new_tokens": decoding.max_new_tokens,
                              "seed": decoding.seed, "texts": len(texts), "batch_size": batch_size,
                              "device": device, "dtype": str(tgt.model.dtype).replace("torch.", ""),
                              "draft_weights": draft_weights},
                 "drafts": {}}
    from tqdm.auto import tqdm  # not at the top: the CLI's parser imports this module with light imports only

    bar = tqdm(total=len(drafts) * len(methods), desc="draft eval", unit="run", disable=bar_disabled(progress))
    for draft in drafts:
        drf = load_model(draft, device=device, dtype=dtype, tokenizer=vocabulary_view(draft).tokenizer,
                         weights=draft_weights)
        synth = Synthesizer(tgt, drf, batch_size=batch_size)
        figures = {}
        for method, s in settings.items():
            _, summary = synth.synthesize(texts, s)
            figures[method] = summarize(summary)
            bar.update(1)
        out["drafts"][str(draft)] = figures
    bar.close()
    return out


def format_eval(result: dict) -> str:
    """A table: one line per (draft, method)."""
    head = f"{'draft':40s} {'method':6s} {'acc.len':>7s} {'accept':>6s}  acceptance by position"
    lines = [head, "-" * len(head)]
    for draft, figures in result["drafts"].items():
        name = draft if len(draft) <= 40 else "..." + draft[-37:]
        for method, f in figures.items():
            per = " ".join(f"{a:.3f}" for a in f["acceptance_per_position"])
            lines.append(f"{name:40s} {method:6s} {f['mean_accepted_length']:7.3f} "
                         f"{f['acceptance']:6.3f}  {per}")
    return "\n".join(lines)
