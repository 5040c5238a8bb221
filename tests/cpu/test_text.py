"""Texts before decoding (engine/text): long texts cut into chunks that fit one decode, chunk
seeds, chunks joined back into one row, normalisation, and the `text:` settings."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from engine.codec.join import join_audio
from engine.config import NORMALIZE_LANGUAGES, SENTENCE_LANGUAGES, JobSpec, TextSpec
from engine.decoding.admission import CHARS_PER_SECOND, expected_tokens
from engine.families.llasa import CONTEXT as LLASA_CONTEXT
from engine.families.llasa import FAMILY as LLASA
from engine.records import RowStats, SynthesisItem, SynthesisResult, item_seed
from engine.text.chunks import Budget, chunk_items, chunk_seeds, plan_text
from engine.text.join import chunk_records, join_codes, join_results
from engine.text.normalize import TextNormalizer, text_normalizer
from engine.text.sentences import sentence_spans

from jobhelpers import PARAGRAPHS


@pytest.fixture(scope="module")
def prompter(kit_dir):
    """The kit's Llasa prompter: a chunk's prompt length is the real one."""
    from engine.families.llasa import FAMILY, LlasaPrompter
    from engine.models.loading import load_tokenizer

    tokenizer = load_tokenizer(kit_dir / "target")
    return LlasaPrompter(tokenizer, FAMILY.layout(tokenizer))


RATE = LLASA.codes_per_second  # codes a second of speech


def llasa_budget(prompter, max_new_tokens: int = 2000) -> Budget:
    return Budget(max_new_tokens, LLASA_CONTEXT, lambda text: len(prompter.build(text)), codes_per_second=RATE)


def test_a_long_text_splits_at_sentence_boundaries_every_chunk_within_the_context(prompter):
    text = "\n\n".join(PARAGRAPHS)
    assert 100 <= len(text) / CHARS_PER_SECOND <= 140  # about two minutes of speech
    budget = llasa_budget(prompter)
    assert not budget.fits(text)
    plan = plan_text(text, budget, "auto")
    assert plan.split and not plan.fits and len(plan.chunks) >= 4
    sentences = {text[a:b].strip() for a, b in sentence_spans(text)}
    ends = {text[:b].rstrip() for a, b in sentence_spans(text)}
    for chunk in plan.chunks:
        assert budget.fits(chunk.text)
        assert expected_tokens(chunk.text, None, RATE) + len(prompter.build(chunk.text)) <= LLASA_CONTEXT
        assert text[chunk.start:chunk.end] == chunk.text
        assert text[:chunk.end] in ends  # cut only where a sentence ends
    assert plan.boundaries == ["sentence"] * (len(plan.chunks) - 1)
    # together the chunks are the text: every sentence once, in order
    assert " ".join(c.text for c in plan.chunks).split() == text.split()
    assert all(any(s in c.text for c in plan.chunks) for s in sentences)
    # a text that fits stays whole, in every mode but sentences
    short = PARAGRAPHS[0]
    assert plan_text(short, budget, "auto").chunks[0].text == short and not plan_text(short, budget, "auto").split
    assert len(plan_text(short, budget, "sentences").chunks) == 5
    assert plan_text(text, budget, "none").chunks[0].text == text.strip()  # none: one decode, fitting or not


def test_a_sentence_too_long_is_cut_at_clause_boundaries_and_says_so(prompter):
    clause = "and the river ran on past the mill, the farms, the church and the old stone bridge"
    sentence = "It began at the spring high in the hills, " + "; ".join([clause] * 12) + "."
    budget = llasa_budget(prompter)
    assert len(sentence_spans(sentence)) == 1 and not budget.fits(sentence)
    plan = plan_text(sentence, budget, "auto")
    assert plan.split and set(plan.boundaries) == {"clause"}
    assert all(budget.fits(c.text) for c in plan.chunks)
    assert all(c.text.endswith((",", ";")) for c in plan.chunks[:-1])
    assert plan.chunks[-1].boundary == "end" and plan.chunks[-1].text.endswith("bridge.")
    # a clause too long for a small budget is cut between words, and says so too
    words = plan_text("one two three four five six seven eight nine ten eleven twelve",
                      Budget(160, codes_per_second=RATE), "auto")
    assert words.split and set(words.boundaries) == {"word"}


def test_a_sentence_that_fits_its_budget_is_not_cut_into_words(prompter):
    """At `max_new_tokens` 120 (2.4 s) the headroom's two fixed seconds leave room for about five
    characters, so no sentence fits with them: a sentence or clause whose speech fits without
    them is kept whole, and only a clause that does not is cut between words, into the fewest
    pieces that fit, about equal."""
    budget = llasa_budget(prompter, 120)
    sentence = "A short line of text."  # 1.4 s of speech: 88 codes with the 1.25 ratio, 188 with the 2 s too
    assert not budget.fits(sentence) and budget.holds(sentence)
    plan = plan_text(sentence, budget, "auto")
    assert [c.text for c in plan.chunks] == [sentence] and not plan.split
    # clauses that each fit without the two seconds: cut there, never between words
    clauses = "It rained, the wind blew, the boats rocked, and the gulls cried."
    plan = plan_text(clauses, budget, "auto")
    assert [c.text for c in plan.chunks] == ["It rained,", "the wind blew,", "the boats rocked,",
                                             "and the gulls cried."]
    assert "word" not in plan.boundaries
    # one clause of 71 characters (28.8 fit in a piece): cut between words into the fewest pieces that fit,
    # three, as even as word boundaries allow (greedy packing would leave 28, 28 and 15 characters)
    words = "one two three four five six seven eight nine ten eleven twelve thirteen"
    assert not budget.holds(words)
    plan = plan_text(words, budget, "auto")
    assert [c.text for c in plan.chunks] == ["one two three four five", "six seven eight nine ten",
                                             "eleven twelve thirteen"]
    assert plan.boundaries == ["word", "word"] and all(budget.holds(c.text) for c in plan.chunks)
    assert not any(budget.holds(f"{a.text} {b.text}") for a, b in zip(plan.chunks, plan.chunks[1:]))


def test_a_budget_too_small_to_cut_into_keeps_texts_whole():
    """Below the headroom's two seconds no piece fits: cutting into words would only make many
    rows that still do not fit (a test's `max_new_tokens: 16`)."""
    tiny = Budget(16, codes_per_second=RATE)
    assert not tiny.cuttable()
    whole = plan_text("One. Two two. Three!", tiny, "auto")
    assert not whole.split and not whole.fits
    sentences = plan_text("One. Two two. Three!", tiny, "sentences")
    assert [c.text for c in sentences.chunks] == ["One.", "Two two.", "Three!"]
    chinese = "一二三四五六七八九十" * 2
    cjk = plan_text(chinese, Budget(160, codes_per_second=RATE), "auto")  # no spaces: cut between characters
    assert "".join(c.text for c in cjk.chunks) == chinese and cjk.split


def test_unknown_split_mode_and_language_are_refused(prompter):
    with pytest.raises(ValueError, match="text.split must be one of"):
        plan_text("Hello.", llasa_budget(prompter), "paragraphs")
    with pytest.raises(ValueError, match="no sentence rules"):
        sentence_spans("Hello.", "xx")


def test_chunk_seeds_derive_from_the_row_seed_and_a_row_of_one_chunk_keeps_its_own(prompter):
    assert chunk_seeds(7, 1) == [7]
    seeds = chunk_seeds(7, 3)
    assert seeds == [item_seed(7, "chunk/0"), item_seed(7, "chunk/1"), item_seed(7, "chunk/2")]
    assert len(set(seeds)) == 3 and chunk_seeds(7, 3) == seeds and chunk_seeds(8, 3) != seeds
    text = "\n\n".join(PARAGRAPHS)
    plan = plan_text(text, llasa_budget(prompter), "auto")
    row = SynthesisItem(text=text, id="row1", prompt_text="Hi.", prompt_codes=[1, 2], temperature=0.5)
    items = chunk_items(row, plan, job_seed=3)
    assert [i.text for i in items] == [c.text for c in plan.chunks]
    assert [i.seed for i in items] == chunk_seeds(item_seed(3, "row1"), len(items))  # the row's seed, as decoded
    assert [i.id for i in items] == [f"row1#{n:04d}" for n in range(len(items))]
    assert all(i.prompt_codes == [1, 2] and i.prompt_text == "Hi." and i.temperature == 0.5 for i in items)
    short = SynthesisItem(text="Short.", id="s")
    assert chunk_items(short, plan_text("Short.", llasa_budget(prompter)), job_seed=3) == [short]


def tone(seconds: float, rate: int = 16_000) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_join_keeps_codes_in_order_and_audio_lasts_the_kept_pieces_minus_the_crossfades():
    rate = 16_000
    silence = np.zeros(rate // 2, dtype=np.float32)
    waves = [np.concatenate([silence, tone(s), silence]) for s in (1.0, 0.6, 0.8)]
    joined = join_audio(waves, rate, crossfade_s=0.02, keep_s=0.1)
    # each chunk's half second of silence at either edge is trimmed to 0.1 s
    assert joined.trimmed == [(round(0.4 * rate), round(0.4 * rate))] * 3
    assert joined.kept == [round((s + 0.2) * rate) for s in (1.0, 0.6, 0.8)]
    assert joined.crossfade == round(0.02 * rate)
    assert len(joined.wave) == sum(joined.kept) - 2 * joined.crossfade
    assert joined.offsets == [0, joined.kept[0] - joined.crossfade,
                              joined.kept[0] + joined.kept[1] - 2 * joined.crossfade]
    # the speech is all there: the joined clip holds the three tones' energy
    energy = float(np.sum(np.square(joined.wave)))
    assert energy == pytest.approx(sum(float(np.sum(np.square(tone(s)))) for s in (1.0, 0.6, 0.8)), rel=0.01)
    assert join_codes([[3, 1], [4], [1, 5, 9]]) == [3, 1, 4, 1, 5, 9]
    one = join_audio([waves[0]], rate)
    assert len(one.wave) == one.kept[0] and one.offsets == [0]
    with pytest.raises(ValueError):
        join_audio([], rate)


def test_a_split_rows_result_and_per_chunk_records(prompter):
    text = "\n\n".join(PARAGRAPHS)
    plan = plan_text(text, llasa_budget(prompter), "auto")
    seeds = chunk_seeds(11, len(plan.chunks))
    stats = RowStats(rounds=2, emitted=5, reached=[2], accepted=[1], generated_tokens=5)
    results = [SynthesisResult(id=f"r#{i}", text=c.text, seed=s, codes=[i, i + 100], finish_reason="stop",
                               stats=stats) for i, (c, s) in enumerate(zip(plan.chunks, seeds))]
    row = join_results("r", text, 11, results)
    assert row.codes == [c for i in range(len(results)) for c in (i, i + 100)]
    assert row.finish_reason == "stop" and row.stats.generated_tokens == 5 * len(results)
    results[1].finish_reason = "length"
    assert join_results("r", text, 11, results).finish_reason == "length"
    joined = join_audio([tone(0.5)] * len(results), 16_000)
    records = chunk_records(plan.chunks, results, joined, 16_000)
    assert [r["boundary"] for r in records] == [*plan.boundaries, "end"]
    assert [r["seed"] for r in records] == seeds and records[0]["audio_start"] == 0.0
    failed = SynthesisResult(id="r#1", text="x", seed=1, error="boom")
    broken = join_results("r", text, 11, [results[0], failed])
    assert broken.error == "chunk r#1: boom" and broken.finish_reason == "error" and not broken.codes


def test_normalisation_writes_numbers_dates_and_money_as_words():
    normalize = TextNormalizer("en")
    said = normalize("On 3/4/2025 it cost $12.50.")
    assert said == "On March fourth twenty twenty five it cost twelve dollars and fifty cents."
    assert not any(ch.isdigit() for ch in said)
    assert normalize("Dr. Lee ran 5 km in 20% less time on Jan. 5th, 2024 at 10:30 a.m.") == (
        "doctor Lee ran five kilometers in twenty percent less time on January fifth twenty twenty four "
        "at ten thirty a m.")
    assert normalize("Room 42B costs $1,234 and 3.05 kg.") == (
        "Room forty two B costs one thousand two hundred and thirty four dollars and three point zero five "
        "kilograms.")
    assert normalize("Nothing to change here.") == "Nothing to change here."
    # cached per distinct text
    before = normalize.cache_info()
    normalize("On 3/4/2025 it cost $12.50.")
    assert normalize.cache_info().hits == before.hits + 1 and normalize.cache_info().currsize == before.currsize
    assert text_normalizer("en") is text_normalizer("en")


def test_normaliser_choices_are_checked():
    with pytest.raises(ValueError, match="nemo has it"):
        TextNormalizer("de", "rules")
    with pytest.raises(ValueError, match="must be one of"):
        TextNormalizer("en", "spacy")
    try:
        import nemo_text_processing  # noqa: F401
    except ImportError:
        from engine.text.normalize import NormalizerUnavailable

        with pytest.raises(NormalizerUnavailable, match="pip install nemo_text_processing"):
            TextNormalizer("en", "nemo")


def test_nemo_normaliser_when_installed():
    """Runs where the [nemo-text] extra is installed (not in CI: Linux x86-64 only, about 1 GB, a
    C compiler)."""
    pytest.importorskip("nemo_text_processing")
    said = TextNormalizer("en", "nemo")("On 3/4/2025 it cost $12.50.")
    assert not any(ch.isdigit() for ch in said) and "twelve dollars" in said


def test_config_language_lists_match_the_libraries():
    from pysbd.languages import LANGUAGE_CODES

    assert SENTENCE_LANGUAGES == tuple(sorted(LANGUAGE_CODES))
    assert NORMALIZE_LANGUAGES["rules"] == ("en",)
    assert TextSpec(normalize="de", normalizer="nemo").normalize == "de"
    with pytest.raises(ValidationError, match="has no language 'de'"):
        TextSpec(normalize="de")
    with pytest.raises(ValidationError, match="no sentence rules"):
        TextSpec(language="xx")


def test_jobs_take_the_text_and_format_settings_and_split_auto_is_the_default():
    raw = {"models": {"target": "t", "codec": "c"}, "decoding": {"method": "ar"},
           "input": {"manifests": ["m.jsonl"]}, "output": {"uri": "out"}}
    assert JobSpec.model_validate(raw).text == TextSpec(split="auto", split_output="joined", normalize="none")
    spec = JobSpec.model_validate({**raw, "text": {"split": "sentences", "split_output": "rows", "normalize": "en"},
                                   "output": {"uri": "out", "format": "nemo", "tarred": True}})
    assert (spec.text.split, spec.text.split_output, spec.output.format, spec.output.tarred) == (
        "sentences", "rows", "nemo", True)
    with pytest.raises(ValidationError, match="output.tarred applies to output.format nemo"):
        JobSpec.model_validate({**raw, "output": {"uri": "out", "format": "lhotse-shar", "tarred": True}})


def test_text_and_format_modules_import_without_torch():
    modules = ("engine.text.chunks, engine.text.join, engine.codec.join, engine.text.items, engine.text.normalize, "
               "engine.text.prepare, engine.io.formats")
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
