"""Orpheus (canopylabs/orpheus-3b-0.1-ft, -pretrained and fine-tunes: Llama causal LMs) emitting
SNAC 24 kHz codes.

Token layout (read from the tokenizer): Orpheus extends a Llama-3 tokenizer with
`<custom_token_N>` tokens, one contiguous run. Its control tokens are custom tokens 1..7 (start
and end of speech, start and end of the human turn, start and end of the AI turn, padding); the
codes start at custom token 10: the k-th code of an utterance is custom token
`10 + 4096 * (k % 7) + code`. A frame is seven codes, SNAC's three levels interleaved
(`engine.codec.snac`), 2,048 samples of 24 kHz audio: 82.03 codes a second.

Prompt (canopyai/Orpheus-TTS `engine_class.py`): start of human, the tokens of `"{voice}: {text}"`
as the tokenizer encodes them (with its begin-of-text token), end of text, end of human, start
of AI, start of speech. A voice prompt is a turn of its own before it (the pretrained model's
text-speech pairs): its transcript's human turn, then start of AI, start of speech, its codes,
end of speech, end of AI. Generation stops at end of speech.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.families.base import Family, SpeechLayout, check_codes_run, llama, token_id

CODEBOOK = 4096  # SNAC codes per level
FRAME = 7  # codes a frame: level 0 once, level 1 twice, level 2 four times
FIRST_CODE = 10  # custom token of output id 0
SAMPLE_RATE = 24_000  # SNAC 24 kHz
FRAME_SAMPLES = 2048  # hop 512 (encoder rates 2, 4, 8, 8) times level 0's stride 4
CONTEXT = 2048  # the context the authors serve Orpheus with (max_model_len), prompt included
END_OF_TEXT = "<|eot_id|>"
CONTROLS = {"start_speech": 1, "end_speech": 2, "start_human": 3, "end_human": 4, "start_ai": 5, "end_ai": 6}
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")  # the -ft English voices
SNAC_PARAMETERS = 19_800_000  # SNAC 24 kHz (its README), held whole by a worker
# the published config.json of the released fine-tuned checkpoint (a Llama-3.2-3B body)
CHECKPOINTS = {"canopylabs/orpheus-3b-0.1-ft": llama(3072, 8192, 28, 24, 8, 128, 156_940, True)}


def custom_token(n: int) -> str:
    return f"<custom_token_{n}>"


class OrpheusPrompter:
    """Builds Orpheus prompt ids.

    Args:
        tokenizer: the checkpoint's tokenizer (a Llama-3 tokenizer with Orpheus's custom tokens).
        layout: the checked token layout.
        voice: the speaker name written before the text (`"{voice}: {text}"`), as the `-ft`
            checkpoints are prompted; None writes the text alone (the pretrained checkpoint).
    """

    def __init__(self, tokenizer, layout: SpeechLayout, voice: str | None = None):
        self.tokenizer, self.layout, self.voice = tokenizer, layout, voice

    def turn(self, text: str) -> list[int]:
        """The human turn holding `text`."""
        c = self.layout.control
        ids = self.tokenizer.encode(text, add_special_tokens=True, verbose=False)
        return [c("start_human"), *map(int, ids), c("end_of_text"), c("end_human")]

    def build(
        self,
        text: str,
        prompt_text: str | None = None,
        prompt_codes: Sequence[int] | None = None,
        voice: str | None = None,
    ) -> list[int]:
        """Prompt ids for `text`, optionally after a voice prompt's turn `(prompt_text,
        prompt_codes)` (SNAC codes in Orpheus's 7-code frames), spoken as `voice` (default: the
        prompter's).

        Raises:
            ValueError: empty text, voice-prompt codes that are not whole frames of codes in
                `0..4095`, or codes without their transcript.
        """
        if not text or not text.strip():
            raise ValueError("text is empty")
        c = self.layout.control
        ids: list[int] = []
        codes = list(prompt_codes or [])
        if codes:
            FAMILY.check_voice_prompt(self.layout, prompt_text, codes)
            ids += self.turn(prompt_text.strip()) + [c("start_ai"), c("start_speech")]
            ids += self.layout.token_ids(codes) + [c("end_speech"), c("end_ai")]
        voice = voice or self.voice
        spoken = f"{voice}: {text.strip()}" if voice else text.strip()
        return ids + self.turn(spoken) + [c("start_ai"), c("start_speech")]


class Orpheus(Family):
    name = "orpheus"
    title = "Orpheus (Llama) + SNAC 24 kHz"
    codec_name = "SNAC 24 kHz"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES
    cycle = FRAME
    context = CONTEXT
    codebook = CODEBOOK
    # SNAC's decoder takes the models' dtype, its encoder and quantizer stay float32: all counted as float32
    codec_parameters = (0, SNAC_PARAMETERS)
    checkpoints = CHECKPOINTS
    # the authors' settings; their README: repetition_penalty >= 1.1 "is required for stable generations"
    sampling = {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3}

    def check_voice(self, voice: str | None) -> None:
        """Any name: the `-ft` checkpoints know `VOICES`, fine-tunes their own speakers."""

    def check_voice_prompt(self, layout: SpeechLayout, prompt_text: str | None, codes: Sequence[int]) -> None:
        """Codes of whole frames in range, with their transcript (the voice prompt is a turn of its
        own: the model hears what was said)."""
        if not codes:
            return
        if not prompt_text or not prompt_text.strip():
            raise ValueError("an Orpheus voice prompt needs its transcript (prompt_text) besides its codes")
        if len(codes) % FRAME:
            raise ValueError(f"voice-prompt codes: {len(codes)} codes are not whole {FRAME}-code frames")
        super().check_voice_prompt(layout, prompt_text, codes)

    def detect(self, tokenizer) -> bool:
        unk = tokenizer.unk_token_id
        last = custom_token(FIRST_CODE + FRAME * CODEBOOK - 1)
        return all(tokenizer.convert_tokens_to_ids(t) not in (None, unk) for t in (custom_token(FIRST_CODE), last))

    def layout(self, tokenizer, model_vocab_size: int | None = None) -> SpeechLayout:
        vocab = model_vocab_size if model_vocab_size is not None else len(tokenizer)
        names = [custom_token(n) for n in range(FIRST_CODE + FRAME * CODEBOOK)]
        base = check_codes_run(tokenizer, names, "Orpheus", vocab)  # controls and codes: one run
        controls = {name: base + n for name, n in CONTROLS.items()}
        controls["end_of_text"] = token_id(tokenizer, END_OF_TEXT, "Orpheus")
        return SpeechLayout(family=self.name, first_code=base + FIRST_CODE, codebook=CODEBOOK, cycle=FRAME,
                            eos_token=controls["end_speech"], vocab_size=vocab, controls=tuple(controls.items()))

    def prompter(self, tokenizer, layout: SpeechLayout) -> OrpheusPrompter:
        return OrpheusPrompter(tokenizer, layout)


FAMILY = Orpheus()
