"""What the engine knows of a family of speech LMs and its codec, and the protocol each family
module fills (`engine/families/llasa.py`, `orpheus.py`).

A family is a way of laying speech codes out in a causal LM's vocabulary, a prompt format and a
codec. The engine samples in an *output space*: the family's code tokens, one contiguous run of
vocabulary ids, followed by the end-of-speech token. The codes come in frames of `cycle`
positions; position `p` of a frame may only take output ids `p * codebook .. (p + 1) * codebook
- 1` (Orpheus: seven positions of 4,096 SNAC codes each), and a row may only end where a frame
ends. Llasa is the case `cycle == 1`: one range of 65,536 X-codec2 codes, end-of-speech at any
step. A prompt ends at a frame boundary, so the k-th generated code (k from 0) is at position
`k % cycle`.

Imports no torch at module level (the job driver reads families before any model is loaded).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SpeechLayout:
    """Where a family's speech codes and end-of-speech token live in a vocabulary, read off the
    checkpoint's tokenizer and checked (`Family.layout`), never taken from constants.

    Attributes:
        family: the family's name.
        first_code: vocabulary id of output id 0 (the codes are `num_codes` contiguous ids).
        codebook: codes per frame position (a codec code is `0..codebook-1`).
        cycle: positions per frame.
        eos_token: vocabulary id of end-of-speech.
        vocab_size: rows of the model's embedding table.
        controls: the family's control tokens, (name, vocabulary id).
    """

    family: str
    first_code: int
    codebook: int
    cycle: int
    eos_token: int
    vocab_size: int
    controls: tuple[tuple[str, int], ...] = ()

    @property
    def num_codes(self) -> int:
        """Code tokens in the output space (all positions' ranges)."""
        return self.codebook * self.cycle

    @property
    def eos_out(self) -> int:
        """Output-space id of end-of-speech."""
        return self.num_codes

    @property
    def vocab_out(self) -> int:
        return self.num_codes + 1

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """`(first output id, size)` of each frame position's codes."""
        return [(p * self.codebook, self.codebook) for p in range(self.cycle)]

    def control(self, name: str) -> int:
        return dict(self.controls)[name]

    def output_token_ids(self) -> torch.Tensor:
        """`[V_out]` vocabulary id of every output-space id."""
        import torch

        codes = torch.arange(self.num_codes, dtype=torch.long) + self.first_code
        return torch.cat([codes, torch.tensor([self.eos_token])])

    def output_space(self) -> OutputSpace:
        return OutputSpace(eos=self.eos_out, cycle=self.cycle, codebook=self.codebook)

    def out_ids(self, codes: Sequence[int], name: str = "codes") -> list[int]:
        """Output ids of a run of codec codes that starts a frame (a voice prompt's, a result's).

        Raises:
            ValueError: a code outside `0..codebook-1` (the message names them as `name`).
        """
        bad = [int(c) for c in codes if not 0 <= int(c) < self.codebook]
        if bad:
            raise ValueError(f"{name} outside 0..{self.codebook - 1}: {bad[:5]}")
        return [int(c) + self.codebook * (k % self.cycle) for k, c in enumerate(codes)]

    def token_ids(self, codes: Sequence[int], name: str = "codes") -> list[int]:
        """Vocabulary ids of a run of codec codes that starts a frame (`out_ids`)."""
        return [self.first_code + o for o in self.out_ids(codes, name)]

    def to_dict(self) -> dict:
        return {"family": self.family, "first_code": self.first_code, "codebook": self.codebook,
                "cycle": self.cycle, "eos_token": self.eos_token, "vocab_size": self.vocab_size,
                "controls": dict(self.controls)}


@dataclass(frozen=True)
class OutputSpace:
    """What a decoder needs of a layout: the end-of-speech output id and the frames. Output id `o`
    (a code) may be sampled at frame position `o // codebook` only, end-of-speech at position 0
    (where a frame ends); with `cycle == 1` every id at every step."""

    eos: int
    cycle: int = 1
    codebook: int = 0

    @property
    def framed(self) -> bool:
        return self.cycle > 1

    def whole_frames(self, n: int) -> int:
        """The longest run of at most `n` codes that ends a frame."""
        return n - n % self.cycle

    def codes(self, out_ids: torch.Tensor) -> torch.Tensor:
        """Codec codes `[n]` of a run of output ids `[n]` that starts a frame (end of speech
        stripped first): an id less its frame position's offset (`SpeechLayout.out_ids` inverted)."""
        if not self.framed:
            return out_ids
        import torch

        return out_ids - self.codebook * (torch.arange(len(out_ids), device=out_ids.device) % self.cycle)

    def phase_table(self, device) -> torch.Tensor:
        """`[V_out]` long: the frame position at which each output id may be sampled."""
        import torch

        return torch.cat([torch.arange(self.eos, device=device) // self.codebook,
                          torch.zeros(1, dtype=torch.long, device=device)])

    def bias_table(self, device, dtype) -> torch.Tensor:
        """`[cycle, V_out]` in `dtype`: 0 where frame position `p` may sample output id `o`, -inf
        where it may not (added to logits: those it may take are left as they are)."""
        import torch

        blocked = self.phase_table(device)[None] != torch.arange(self.cycle, device=device)[:, None]
        return torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, float("-inf"))


class Prompter(Protocol):
    """Builds a family's prompt ids; the prompt ends where the first generated code starts a frame."""

    def build(self, text: str, prompt_text: str | None = None,
              prompt_codes: Sequence[int] | None = None, voice: str | None = None) -> list[int]:
        """Prompt ids for `text`, optionally cloning a voice from `(prompt_text, prompt_codes)` or
        speaking as a named `voice` (a speaker the checkpoint was trained on).

        Raises:
            ValueError: empty text, voice-prompt codes the family cannot take, or a named voice
                where the family has none.
        """
        ...


class Family(ABC):
    """One family of speech LMs and its codec. Subclasses state their facts as class attributes
    and read the rest off the checkpoint.

    Attributes:
        name: the `models.family` value.
        title: the LM and codec, for people.
        codec_name: the codec, for people.
        sample_rate: the codec's audio rate (the loaded codec is checked against it).
        frame_samples: audio samples per frame.
        cycle: codes per frame.
        context: tokens the LM was trained with, prompt included (the context a text must fit).
        codebook: codes per frame position (the head keeps `codebook * cycle + 1` output ids).
        codec_parameters: (parameters a worker holds to decode codes in the models' dtype, those
            it holds in float32), for sizing a worker without loading the codec.
        sampling: the family's sampling defaults (`DecodingSettings` fields), applied where a
            job or a call leaves them unset.
        checkpoints: the released checkpoints' dimensions (their config.json's Llama fields), for
            sizing without weights (`engine.decoding.sizing`, docs/sizing.md); a loaded model
            reads its own config.
    """

    name: str
    title: str
    codec_name: str
    sample_rate: int
    frame_samples: int
    cycle: int
    context: int
    codebook: int
    codec_parameters: tuple[int, int]
    sampling: dict = {}
    checkpoints: dict[str, dict] = {}

    @property
    def output_ids(self) -> int:
        """Rows of the LM head the engine keeps: every code of every frame position, and end of speech."""
        return self.codebook * self.cycle + 1

    @property
    def codes_per_second(self) -> float:
        return self.sample_rate * self.cycle / self.frame_samples

    @abstractmethod
    def detect(self, tokenizer) -> bool:
        """Whether `tokenizer` holds this family's marker tokens."""

    @abstractmethod
    def layout(self, tokenizer, model_vocab_size: int | None = None) -> SpeechLayout:
        """The checked token layout.

        Raises:
            ValueError: a token the family needs is missing, the codes are not one contiguous
                run, or the model's embedding table is too small for them.
        """

    @abstractmethod
    def prompter(self, tokenizer, layout: SpeechLayout) -> Prompter:
        """The family's prompt builder over `tokenizer`."""

    def check_voice_prompt(self, layout: SpeechLayout, prompt_text: str | None, codes: Sequence[int]) -> None:
        """A voice prompt's codes (and transcript) as the family's prompter takes them: the
        prompter checks them so, and the dry run, which has no tokenizer to build prompts with.

        Raises:
            ValueError: codes outside the codebook (the family may refuse more).
        """
        layout.out_ids(codes, "voice-prompt codes")

    def check_voice(self, voice: str | None) -> None:
        """A named voice the family's prompts can carry (None: none asked for).

        Raises:
            ValueError: the family has no named voices.
        """
        if voice:
            raise ValueError(f"voice {voice!r}: {self.name.title()} has no named voices; clone one with a "
                             "voice prompt (a clip and its transcript)")

    def check_codec(self, codec, where: str) -> None:
        """A codec (`engine.codec.base.Codec`, loaded by `engine.codec.load.load_codec`) must be
        the family's: its rate and frame.

        Raises:
            ValueError: another codec, or another configuration of it.
        """
        have = (codec.sample_rate, codec.frame_codes)
        if have != (self.sample_rate, self.cycle):
            raise ValueError(f"{where}: a {codec.sample_rate} Hz codec with {codec.frame_codes} code(s) a frame; "
                             f"{self.title} needs {self.codec_name} ({self.sample_rate} Hz, {self.cycle} a frame)")


class TokenTable:
    """A tokenizer's tokens and ids read from its `tokenizer.json` alone, without transformers (the
    job driver's dry run): enough for `Family.detect` and `Family.layout`, which read tokens by
    name through the same two members a transformers tokenizer has."""

    unk_token_id = None

    def __init__(self, ids: dict[str, int]) -> None:
        self.ids = ids

    @classmethod
    def from_json(cls, data: bytes | str) -> TokenTable:
        """From the bytes of a `tokenizer.json`: its model's vocabulary (BPE, WordPiece) and its
        added tokens.

        Raises:
            ValueError: not a tokenizer.json.
        """
        import json

        try:
            doc = json.loads(data)
            vocab = (doc.get("model") or {}).get("vocab")
            ids = dict(vocab) if isinstance(vocab, dict) else {}
            ids.update({t["content"]: int(t["id"]) for t in doc.get("added_tokens") or []})
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a tokenizer.json ({exc})") from None
        return cls(ids)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):
        if isinstance(tokens, str):
            return self.ids.get(tokens)
        return [self.ids.get(t) for t in tokens]

    def __len__(self) -> int:
        return max(self.ids.values(), default=-1) + 1


def llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int,
          vocab: int, tied: bool) -> dict:
    """The Llama fields of a config.json (a released checkpoint's, in `Family.checkpoints`)."""
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "vocab_size": vocab, "tie_word_embeddings": tied}


def token_id(tokenizer, token: str, family: str) -> int:
    """The id of `token` in `tokenizer`.

    Raises:
        ValueError: the tokenizer lacks it.
    """
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no {token!r}: not a {family} tokenizer")
    return int(tid)


def check_codes_run(tokenizer, names: Sequence[str], family: str, vocab: int) -> int:
    """The first id of code tokens `names`, which must be one contiguous run inside `vocab` rows.

    Raises:
        ValueError: a token is missing, the run has gaps, or it ends past the model's vocabulary.
    """
    first = token_id(tokenizer, names[0], family)
    ids = tokenizer.convert_tokens_to_ids(list(names))
    if any(tid is None for tid in ids) or ids != list(range(first, first + len(names))):
        raise ValueError(f"code tokens {names[0]}..{names[-1]} are not contiguous from id {first}: "
                         f"not a {family} tokenizer")
    if first + len(names) > vocab:
        raise ValueError(f"code tokens end at id {first + len(names) - 1} but the model's vocabulary has "
                         f"{vocab} rows")
    return first
