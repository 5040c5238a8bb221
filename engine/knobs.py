"""The per-row sampling knobs, described once: every layer that carries them is made from `KNOBS`.

A knob is a setting a job gives every row and a manifest row or an item may give itself
(temperature, top-p, top-k, repetition penalty, the token budget). Its entry holds what each
layer needs: the settings field's type, bounds, default and description (`DecodingSettings`,
`ManifestRow`), and for a warp knob (one applied to the logits) the `[b]` tensor a round reads
(its column of `RoundState.sampling` and `RowWarp`) and the step of the round's plan it turns
on (`SamplingSteps`). Made from it: the settings fields, the manifest row's override fields and
override list, `ITEM_SAMPLING_FIELDS`, `Warp`, the round state's sampling columns and the
decoder's row write. The maths that applies a knob is code (`engine.decoding.sampling`).

Imports nothing beyond the standard library (no torch, no pydantic), so the settings, the
manifests and the records read it without loading the decoding stack.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, make_dataclass, replace

# The highest sampling temperature a job, a row or a call may ask for. A speech LM's logits
# spread over a few tens of nats; divided by more than 10 they differ by a few nats across tens
# of thousands of codes, so what is sampled is near-uniform noise, not speech, and far above it
# (1e9) uniform to float precision. A value above it is a mistake (a typo, a percentage), refused.
MAX_TEMPERATURE = 10.0


@dataclass(frozen=True, eq=False)
class Knob:
    """One per-row sampling setting.

    Attributes:
        name: its field in `DecodingSettings`, a manifest row, `SynthesisItem` and `Warp`.
        type: `float` or `int`.
        default: the job's default (the `DecodingSettings` field's).
        description: the field's description (the job-spec reference, the CLI's help).
        bounds: the field's pydantic constraints (`ge`, `gt`, `le`, `allow_inf_nan`), which a
            job's, a row's and an item's value alike must meet.
        off: the value that leaves the logits as they are; a free slot's column holds it
            (None: not a warp knob).
        column: its `[b]` tensor in `RoundState.sampling` and `RowWarp` (None: not a warp knob,
            e.g. the token budget, which becomes the row's length limit).
        dtype: that tensor's torch dtype, by name.
        greedy_as: what a greedy row's column holds instead of its value (a placeholder: a
            greedy row's decisions are argmaxes); None: its value.
        vocab_off: a value at or above the vocabulary's size means off (written as `off`).
        step: the `SamplingSteps` field the knob turns on (None: its maths always runs). A flag
            turns on where a row's value is not `off`; a number takes the largest value.
        greedy_off: greedy rows have no use for it (top-p, top-k): a greedy setting must leave
            it off, and a greedy row never turns its step on.
    """

    name: str
    type: type
    default: float | int
    description: str
    bounds: dict = field(default_factory=dict)
    off: float | int | None = None
    column: str | None = None
    dtype: str = "float32"
    greedy_as: float | int | None = None
    vocab_off: bool = False
    step: str | None = None
    greedy_off: bool = False

    def host_value(self, value: float | int, vocab: int | None = None) -> float | int:
        """The value a round uses for a row's `value` (`vocab`: the output vocabulary's size,
        None: not known)."""
        if self.vocab_off and vocab is not None and value >= vocab:
            return self.off
        return value


# Temperature is the knob that also chooses the mode: 0 is greedy (`Warp.greedy`, the `greedy`
# column), which no other entry describes.
KNOBS: tuple[Knob, ...] = (
    Knob("temperature", float, 0.8, bounds={"ge": 0.0, "le": MAX_TEMPERATURE}, off=1.0, column="temperature",
         greedy_as=1.0, description=(
             "0 is greedy. Unset, the model family's default: Llasa 0.8 (its card), Orpheus 0.6. At most "
             f"{MAX_TEMPERATURE:g}: above it a speech LM samples noise.")),
    Knob("top_p", float, 1.0, bounds={"gt": 0.0, "le": 1.0}, off=1.0, column="top_p", step="top_p",
         greedy_off=True, description=(
             "Nucleus sampling mass (1 = off). Unset, the model family's default: Llasa 1, Orpheus 0.8.")),
    Knob("top_k", int, 0, bounds={"ge": 0}, off=0, column="top_k", dtype="int64", vocab_off=True,
         step="max_top_k", greedy_off=True, description="Keep the k most likely tokens (0 = off)."),
    Knob("repetition_penalty", float, 1.0, bounds={"gt": 0.0, "allow_inf_nan": False}, off=1.0, column="penalty",
         step="penalty", description=(
             "CTRL-style penalty (1 = off; finite). Unset, the model family's default: Llasa 1, Orpheus 1.3 "
             "(its authors: stable speech needs >= 1.1).")),
    Knob("max_new_tokens", int, 2000, bounds={"ge": 1}, description=(
        "Speech codes to generate at most (Llasa: 50 per second of audio; Orpheus: about 82, seven "
        "a frame); the context limit may cut it shorter. A value above the model's context (its "
        "family's, prompt included) is refused, never capped: a job's before any work, a manifest "
        "row's or an item's own as that row's error record.")),
)

KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
WARP_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.column is not None)  # applied to the logits
GREEDY_OFF: tuple[str, ...] = tuple(k.name for k in KNOBS if k.greedy_off)


def _greedy(warp) -> bool:
    """Temperature 0: the row takes argmaxes."""
    return warp.temperature == 0.0


# One row's warp knobs: the temperature (first in `KNOBS`), given; every other one off unless given.
Warp = make_dataclass(
    "Warp", [(k.name, k.type) if k.name == "temperature" else (k.name, k.type, field(default=k.off))
             for k in WARP_KNOBS],
    frozen=True, namespace={"__module__": __name__, "greedy": property(_greedy), "__doc__": (
        "Sampling settings applied to logits, in this order: repetition penalty, temperature, top-k, top-p "
        "(one field per warp knob of `KNOBS`). `temperature == 0` means greedy (`greedy`: no "
        "probabilities are formed). Built by `DecodingSettings.warp`; the other knobs default to off.")})


@dataclass(frozen=True)
class SamplingSteps:
    """Which sampling steps a round runs: host values over the rows it serves (the rows submitted
    since the decoder was last idle), so its code is specialised on them (one graph per plan).
    A row whose knob is off is left exactly as it would be alone whichever steps run.

    Attributes:
        sampled: some row samples (probabilities are formed).
        greedy: some row is greedy (argmaxes are taken).
        penalty: some row has a repetition penalty.
        top_p: some sampled row uses top-p.
        max_top_k: the largest top-k of a sampled row (0: none).
    """

    sampled: bool = False
    greedy: bool = False
    penalty: bool = False
    top_p: bool = False
    max_top_k: int = 0

    def merged(self, warp: Warp, vocab: int | None = None) -> SamplingSteps:
        """These steps and those the row of `warp` needs (`vocab`: see `Knob.host_value`)."""
        met = {"sampled": self.sampled or not warp.greedy, "greedy": self.greedy or warp.greedy}
        for knob in WARP_KNOBS:
            if knob.step is None or (knob.greedy_off and warp.greedy):
                continue
            value, now = knob.host_value(getattr(warp, knob.name), vocab), getattr(self, knob.step)
            met[knob.step] = (now or value != knob.off) if isinstance(now, bool) else max(now, value)
        return replace(self, **met)

    @classmethod
    def of(cls, warps: Iterable[Warp], vocab: int | None = None) -> SamplingSteps:
        """The steps `warps`' rows need."""
        steps = cls()
        for warp in warps:
            steps = steps.merged(warp, vocab)
        return steps

    def labels(self) -> list[str]:
        """The steps that run, by name (a plan's description): a flag by its name, a largest
        value by its knob's name and the value (`top_k50`)."""
        knob_of = {k.step: k.name for k in WARP_KNOBS if k.step}
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                out += [f.name] if value else []
            elif value:
                out.append(f"{knob_of[f.name]}{value}")
        return out
