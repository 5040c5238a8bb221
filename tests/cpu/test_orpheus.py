"""The Orpheus family on its tiny kit: detection, token layout, prompts, the per-position output
space (seven code ranges a frame, end of speech where a frame ends), greedy parity with
transformers' `generate` under the same mask, and the exact rule's law through the masked round."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.config import Warp
from engine.decoding.sampling import warp_probs
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.families import UnknownFamily, detect, family_named, family_settings
from engine.families.base import OutputSpace
from engine.families.orpheus import CODEBOOK, FRAME, VOICES, custom_token
from engine.models.loading import load_model, load_tokenizer

from synthhelpers import TEXTS

METHODS = ["ar", "exact", "pcg", "ssd", "topk"]


def test_each_kit_is_detected_as_its_family_and_a_wrong_family_is_refused(kit_dir, orpheus_kit_dir):
    llasa, orpheus = load_tokenizer(kit_dir / "target"), load_tokenizer(orpheus_kit_dir / "target")
    assert detect(llasa).name == "llasa" and detect(orpheus).name == "orpheus"
    with pytest.raises(UnknownFamily, match="is a checkpoint of the orpheus family .* not llasa: set models.family"):
        load_model(orpheus_kit_dir / "target", family="llasa")
    from engine.families.base import TokenTable

    with pytest.raises(UnknownFamily, match="no known speech-LM family matches its tokenizer"):
        detect(TokenTable({"hello": 0, "<|eot_id|>": 1}), "some/llama")


def test_the_orpheus_layout_is_read_from_the_tokenizer(orpheus64):
    layout, tok = orpheus64.layout, orpheus64.target.tokenizer
    assert layout.family == "orpheus" and (layout.codebook, layout.cycle) == (CODEBOOK, FRAME)
    assert layout.first_code == tok.convert_tokens_to_ids(custom_token(10))
    assert layout.eos_token == tok.convert_tokens_to_ids(custom_token(2))
    assert layout.control("start_human") == tok.convert_tokens_to_ids(custom_token(3))
    assert layout.control("end_of_text") == tok.convert_tokens_to_ids("<|eot_id|>")
    assert layout.num_codes == 7 * 4096 and layout.eos_out == layout.num_codes
    # the k-th code of an utterance is custom token 10 + 4096 * (k % 7) + code
    codes = [5, 6, 7, 8, 9, 10, 11, 4095]
    want = [tok.convert_tokens_to_ids(custom_token(10 + 4096 * (k % 7) + c)) for k, c in enumerate(codes)]
    assert layout.token_ids(codes) == want
    space = layout.output_space()
    assert space.codes(torch.tensor(want) - layout.first_code).tolist() == codes
    assert space.whole_frames(13) == 7 and space.whole_frames(14) == 14
    assert orpheus64.family.sampling == {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3}
    assert round(orpheus64.family.codes_per_second, 4) == 82.0312 and orpheus64.max_context == 2048


def test_orpheus_prompts_follow_the_reference_format(orpheus64):
    p, layout, tok = orpheus64.prompter, orpheus64.layout, orpheus64.target.tokenizer
    c = layout.control
    text_ids = tok.encode("Hello there.", add_special_tokens=True)
    assert text_ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert p.build("Hello there.") == [c("start_human"), *text_ids, c("end_of_text"), c("end_human"),
                                       c("start_ai"), c("start_speech")]
    # the -ft checkpoints' "{voice}: {text}"
    assert p.build("Hello there.", voice=VOICES[0])[1:-4] == tok.encode("tara: Hello there.", add_special_tokens=True)
    codes = list(range(14))  # two frames
    cloned = p.build("Hello there.", "Reference words.", codes)
    turn = [c("start_human"), *tok.encode("Reference words.", add_special_tokens=True), c("end_of_text"),
            c("end_human"), c("start_ai"), c("start_speech"), *layout.token_ids(codes), c("end_speech"), c("end_ai")]
    assert cloned == turn + p.build("Hello there.")
    with pytest.raises(ValueError, match="13 codes are not whole 7-code frames"):
        p.build("Hello.", "Reference words.", codes[:13])
    with pytest.raises(ValueError, match="needs its transcript"):
        p.build("Hello.", None, codes)
    with pytest.raises(ValueError, match="voice-prompt codes outside 0..4095"):
        p.build("Hello.", "Reference.", [4096] * 7)


@pytest.mark.parametrize("method", METHODS)
def test_every_row_is_whole_frames_of_codes_in_their_positions_ranges(orpheus64, method):
    """Sampled rows of every rule (greedy ones too, a voice prompt, the family's penalty): each
    code lies in its frame position's range (a code from another range would read outside
    0..4095) and every row is whole frames, those that ended and those cut at their limit."""
    settings = DecodingSettings(method=method, theta=0.4, max_new_tokens=40, seed=3)
    items = [*TEXTS, SynthesisItem("Cloned voice.", id="clone", prompt_text="Reference words.",
                                   prompt_codes=list(range(100, 114))),
             SynthesisItem("Greedy row.", id="greedy", temperature=0.0, top_p=1.0)]
    results, summary = orpheus64.synthesize(items, settings)
    assert all(r.error is None for r in results)
    assert {r.finish_reason for r in results} == {"eos", "length"}
    for r in results:
        assert len(r.codes) % FRAME == 0 and all(0 <= c < CODEBOOK for c in r.codes), r.id
    assert summary.settings["repetition_penalty"] == 1.3  # the family's default, under every rule
    if method != "ar":
        assert summary.stats.drafted > 0


def test_without_the_frame_masks_codes_leave_their_ranges(orpheus64):
    """The check above can fail: the same rows decoded with the masks off sample ids of other
    frame positions (and end mid-frame)."""
    synth = orpheus64
    decoder = SpeculativeDecoder(synth.target.model, None, 0, 4, synth.max_context, OutputSpace(synth.layout.eos_out))
    settings = synth.settings(DecodingSettings(method="ar", seed=3))
    requests = [Request(key=i, prompt_ids=synth.prompter.build(t), seed=i, max_new_tokens=40, warp=settings.warp)
                for i, t in enumerate(TEXTS)]
    rows = [row for _, row in decoder.run(requests)]
    assert any(not 0 <= c < CODEBOOK for row in rows for c in row.codes)


def masked_transformers_generate(synth: Synthesizer, reference, text: str, max_new_tokens: int) -> list[int]:
    """Greedy `generate` of transformers' Llama over the kit's target with the family's repetition
    penalty, every step restricted to the ids its frame position allows (end of speech where a
    frame ends), as codes."""
    from transformers import LogitsProcessor, LogitsProcessorList

    layout = synth.layout
    prompt = synth.prompter.build(text)

    class FrameMask(LogitsProcessor):
        def __call__(self, input_ids, scores):
            k = input_ids.shape[1] - len(prompt)
            allowed = torch.full_like(scores, float("-inf"))
            first = layout.first_code + layout.codebook * (k % layout.cycle)
            allowed[:, first:first + layout.codebook] = 0
            if k % layout.cycle == 0:
                allowed[:, layout.eos_token] = 0
            return scores + allowed

    out = reference.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=layout.eos_token,
                             repetition_penalty=synth.family.sampling["repetition_penalty"],
                             pad_token_id=layout.eos_token, logits_processor=LogitsProcessorList([FrameMask()]))
    ids = out[0, len(prompt):].tolist()
    if ids and ids[-1] == layout.eos_token:
        ids = ids[:-1]
    ids = ids[: len(ids) - len(ids) % layout.cycle]  # whole frames, as the engine keeps them
    return layout.output_space().codes(torch.tensor(ids, dtype=torch.long) - layout.first_code).tolist()


def test_greedy_rules_equal_transformers_generate_under_the_frame_mask(orpheus64, orpheus_kit_dir):
    from transformers import LlamaForCausalLM

    reference = LlamaForCausalLM.from_pretrained(str(orpheus_kit_dir / "target"), dtype=torch.float64).eval()
    texts = TEXTS[:4]
    want = [masked_transformers_generate(orpheus64, reference, t, 30) for t in texts]
    assert len({tuple(w) for w in want}) == len(texts) and any(0 < len(w) < 28 for w in want), want
    for method, theta in [*((m, 0.4) for m in METHODS if m != "pcg"), ("pcg", 1.0)]:
        settings = DecodingSettings(method=method, theta=theta, temperature=0, gamma=3, max_new_tokens=30)
        results, _ = orpheus64.synthesize(texts, settings, batch_size=3)
        assert [r.codes for r in results] == want, method


def test_greedy_pcg_emits_group_mates_of_the_argmax_inside_its_range(orpheus64):
    groups = orpheus64.groups(0.4)
    settings = DecodingSettings(method="pcg", theta=0.4, temperature=0, repetition_penalty=1.0, max_new_tokens=35)
    results, summary = orpheus64.synthesize(TEXTS[:4], settings)
    model, layout = orpheus64.target.model, orpheus64.layout
    swapped = 0
    for text, res in zip(TEXTS, results):
        prompt = orpheus64.prompter.build(text)
        ids = prompt + layout.token_ids(res.codes)
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], model.new_cache(1, len(ids) + 1),
                       len(ids))[0, len(prompt) - 1: len(ids) - 1]
        out = [i - layout.first_code for i in ids[len(prompt):]]
        for k, (o, row) in enumerate(zip(out, logits)):
            lo = layout.codebook * (k % layout.cycle)
            best = lo + int(row[lo: lo + layout.codebook].argmax())
            mates = set(groups.members[groups.indptr[best]:groups.indptr[best + 1]].tolist())
            assert o in mates and all(lo <= m < lo + layout.codebook for m in mates)
            swapped += o != best
    assert swapped > 0 and summary.stats.mean_accepted_length > 1.0


def law_fit(observed: np.ndarray, law: np.ndarray) -> float:
    from scipy.stats import chisquare

    keep = law > 0
    assert observed[~keep].sum() == 0, "a token outside the law's support was emitted"
    return chisquare(observed[keep], law[keep] / law[keep].sum() * observed[keep].sum()).pvalue


def test_exact_speculation_emits_the_masked_targets_law_at_each_frame_position(orpheus_kit_dir):
    """Many seeds of one prompt through `exact` rounds (gamma 2): the first code follows the
    target's law over frame position 0's range and end of speech, the second (after the most
    frequent first code) its law over position 1's range: the mask changes the law both models
    are judged by, and the rule keeps it."""
    synth = Synthesizer.load(orpheus_kit_dir / "target", draft=orpheus_kit_dir / "draft", device="cpu",
                             dtype="float32")
    layout = synth.layout
    warp = Warp(temperature=1.0, top_k=6)
    settings = DecodingSettings(method="exact", gamma=2, temperature=1.0, top_k=6, top_p=1.0, repetition_penalty=1.0,
                                max_new_tokens=FRAME)
    text, rows = "Hello there.", 2000
    items = [SynthesisItem(text, id=str(i), seed=i) for i in range(rows)]
    results, _ = synth.synthesize(items, settings, batch_size=250)
    first = np.array([r.codes[0] if r.codes else layout.eos_out for r in results])
    model, prompt = synth.target.model, synth.prompter.build(text)

    def law(ids: list[int], phase: int) -> np.ndarray:
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], model.new_cache(1, len(ids) + 1),
                       len(ids), logits_at="last")[0, -1]
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        allowed[phase * layout.codebook:(phase + 1) * layout.codebook] = True
        allowed[layout.eos_out] = phase == 0
        probs = warp_probs(logits.masked_fill(~allowed, float("-inf"))[None], torch.zeros(1, len(logits), dtype=bool),
                           warp)[0]
        return probs.double().numpy()

    law0 = law(prompt, 0)
    assert law_fit(np.bincount(first, minlength=layout.vocab_out), law0) > 1e-3
    mode = int(np.bincount(first).argmax())
    assert mode != layout.eos_out
    second = np.array([r.codes[1] + layout.codebook for r in results if r.codes and r.codes[0] == mode])
    assert len(second) > 300
    law1 = law(prompt + layout.token_ids([mode]), 1)
    assert law_fit(np.bincount(second, minlength=layout.vocab_out), law1) > 1e-3


def test_the_familys_sampling_defaults_fill_only_what_is_unset():
    orpheus = family_named("orpheus")
    got = family_settings(DecodingSettings(method="exact", temperature=0.9), orpheus)
    assert (got.temperature, got.top_p, got.repetition_penalty) == (0.9, 0.8, 1.3)
    greedy = family_settings(DecodingSettings(temperature=0), orpheus)  # no top-p for a greedy setting
    assert (greedy.temperature, greedy.top_p, greedy.repetition_penalty) == (0, 1.0, 1.3)
    assert family_settings(DecodingSettings(), family_named("llasa")).temperature == 0.8
    assert family_settings(got, orpheus) == got


def test_orpheus_models_from_s3(orpheus_kit_dir, s3_endpoint, s3_bucket, tmp_path):
    """The Orpheus kit in object storage: the driver finds the family from the target's
    tokenizer.json and the code rows by ranged reads (the groups' source, seven ranges), and a
    synthesizer and codec load from copies of it."""
    from engine.codec.load import load_codec
    from engine.config import JobSpec, StorageOptions
    from engine.groups.source import speech_rows_of
    from engine.io.storage import Storage
    from engine.runtime.family import target_family

    storage = Storage(StorageOptions(endpoint_url=s3_endpoint))
    for part in ("target", "draft", "codec"):
        for f in (orpheus_kit_dir / part).iterdir():
            storage.write_bytes(f"s3://{s3_bucket}/orpheus/{part}/{f.name}", f.read_bytes())
    uri = f"s3://{s3_bucket}/orpheus"
    spec = JobSpec.model_validate({"name": "s3", "models": {"target": f"{uri}/target", "codec": f"{uri}/codec"},
                                   "decoding": {"method": "ar"}, "input": {"manifests": ["m.jsonl"]},
                                   "output": {"uri": str(tmp_path / "out")},
                                   "storage": {"endpoint_url": s3_endpoint}})
    family, layout = target_family(spec, storage)
    assert family.name == "orpheus" and layout.ranges == [(p * 4096, 4096) for p in range(7)]
    rows, read_layout = speech_rows_of(storage, f"{uri}/target")
    assert read_layout == layout and tuple(rows.shape) == (7 * 4096, 128)
    synth = Synthesizer.load(storage.local_dir(f"{uri}/target"), draft=storage.local_dir(f"{uri}/draft"),
                             device="cpu", dtype="float32", batch_size=2)
    codec = load_codec(f"{uri}/codec", storage=storage)
    synth.family.check_codec(codec, "codec")
    (result,), _ = synth.synthesize(["Hello there."], DecodingSettings(method="exact", max_new_tokens=14))
    assert len(codec.decode([result.codes])[0]) == len(result.codes) // FRAME * 2048 > 0
    with pytest.raises(ValueError, match="models.target: .* is a checkpoint of the orpheus family"):
        target_family(spec.model_copy(update={"models": spec.models.model_copy(update={"family": "llasa"})}), storage)


def test_a_named_voice_is_the_orpheus_prompts_and_refused_by_llasa(orpheus64, kit_synth):
    settings = DecodingSettings(method="ar", max_new_tokens=14, seed=1)
    items = [SynthesisItem("Hello there.", id="plain"), SynthesisItem("Hello there.", id="tara", voice="tara")]
    plain, tara = orpheus64.synthesize(items, settings)[0]
    assert plain.error is None and tara.error is None
    voiced = orpheus64.request("Hello there.", orpheus64.settings(settings), 1, "k", voice="tara")
    assert voiced.prompt_ids == orpheus64.prompter.build("Hello there.", voice="tara") != orpheus64.prompter.build(
        "Hello there.")
    (refused,), _ = kit_synth.synthesize([SynthesisItem("Hello there.", voice="tara")], settings)
    assert refused.error == ("voice 'tara': Llasa has no named voices; clone one with a voice prompt (a clip and "
                             "its transcript)")


def test_generate_bench_and_draft_eval_run_on_the_orpheus_kit(orpheus_kit_dir, tmp_path, capsys):
    """The command line's tools on the Orpheus kit: every rule compared (with the outlook the cost
    model gives), a bench grid, the draft's evaluation; 24 kHz clips of whole frames."""
    import json

    import soundfile as sf

    from engine.cli import main as run_cli

    kit = str(orpheus_kit_dir)
    assert run_cli(["generate", "--kit", kit, "--text", "Hello there.", "--text", "A second line.", "--method", "all",
                    "--max-new-tokens", "21", "--device", "cpu", "--wav-dir", str(tmp_path / "wav"),
                    "--out", str(tmp_path / "all.json"), "--quiet"]) == 0
    doc = json.loads((tmp_path / "all.json").read_text())
    assert [r["summary"]["method"] for r in doc["runs"]] == METHODS and doc["outlook"]
    clips = sorted((tmp_path / "wav").rglob("*.wav"))
    assert clips and all(sf.info(c).samplerate == 24_000 and sf.info(c).frames % 2048 == 0 for c in clips)
    assert run_cli(["bench", "--kit", kit, "--device", "cpu", "--methods", "ar,pcg", "--gammas", "3",
                    "--batch-sizes", "2", "--reps", "1", "--max-new-tokens", "14", "--cost-reps", "1",
                    "--out", str(tmp_path / "bench.json"), "--quiet"]) == 0
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["models"]["family"] == "orpheus" and bench["batches"]["2"]["runs"]
    (tmp_path / "texts.txt").write_text("Hello there.\nA second line.\n")
    assert run_cli(["draft", "eval", "--target", f"{kit}/target", "--draft", f"{kit}/draft",
                    "--texts-file", str(tmp_path / "texts.txt"), "--max-new-tokens", "21", "--device", "cpu",
                    "--out", str(tmp_path / "eval.json"), "--quiet"]) == 0
    drafts = json.loads((tmp_path / "eval.json").read_text())["drafts"]
    assert drafts[f"{kit}/draft"]["exact"]["mean_accepted_length"] > 1.0
    info = json.loads((orpheus_kit_dir / "draft" / "pcg_draft.json").read_text())
    assert info["trained"]["loss"] == "kd" and info["trained"]["loss_last"] < info["trained"]["loss_first"]


def test_augment_crosses_texts_with_named_voices_as_with_voice_prompts(orpheus_kit_dir, tmp_path):
    from engine.config import JobSpec
    from engine.io.manifest import ManifestRow
    from engine.runtime.augment import combinations, pick, variant_row

    raw = {"name": "aug", "kind": "augment",
           "models": {"target": str(orpheus_kit_dir / "target"), "codec": str(orpheus_kit_dir / "codec")},
           "decoding": {"method": "ar"}, "input": {"manifests": ["m.jsonl"]}, "output": {"uri": str(tmp_path)},
           "augment": {"named_voices": ["tara", "leah"], "prompts": [{"id": "p1", "text": "Ref.", "codes": [1] * 7}],
                       "include_no_prompt": True, "seeds": [0, 1]}}
    spec = JobSpec.model_validate(raw)
    grid = combinations(spec.augment, spec)
    assert len(grid) == 4 * 2  # (p1, tara, leah, own voice) x 2 seeds
    rows = [variant_row(ManifestRow(id="t1", text="Hello."), c) for c in grid]
    assert sorted(r.get("voice", "") for r in rows) == ["", "", "", "", "leah", "leah", "tara", "tara"]
    assert all("prompt_id" not in r for r in rows if r.get("voice"))
    assert len({c["voice"] if isinstance(c["voice"], str) else getattr(c["voice"], "id", None)
                for c in pick(grid, "t1", 4, 0)}) == 4  # one of each voice before any repeats
    with pytest.raises(ValueError, match="named_voices must be distinct"):
        JobSpec.model_validate({**raw, "augment": {"named_voices": ["tara", "tara"]}})


def test_the_quality_gate_hears_orpheus_audio_at_its_verifiers_rate(orpheus64, orpheus_kit_dir):
    """The gate's ASR and speaker encoder take 16 kHz: an Orpheus row's 24 kHz audio and its voice
    prompt (given as codes, decoded by SNAC) are resampled for them; the durations it measures are
    the audio's own, best-of candidates are told apart by speaker similarity."""
    from engine.codec.load import load_codec
    from engine.config import QualitySpec
    from engine.metrics.gate import QualityGate

    codec = load_codec(orpheus_kit_dir / "codec")
    gate = QualityGate.load(QualitySpec(asr="pocketsphinx", speaker="resemblyzer",
                                        min_speaker_similarity=-1.0, best_of=2), codec)
    prompt = {"prompt_text": "A voice.", "prompt_codes": [int(c) for c in np.arange(35) * 977 % 4096]}
    items = [SynthesisItem(text=t, id=str(i), **prompt) for i, t in enumerate(TEXTS[1:4])]
    results, summary = orpheus64.synthesize(items, DecodingSettings(method="exact", max_new_tokens=70), quality=gate)
    assert summary.quality["decodes"] == 6 and summary.quality["passed"] == 3
    for res in results:
        verdict = res.quality
        sims = [a.speaker_similarity for a in verdict.attempts]
        assert len(sims) == 2 and all(s is not None and -1 <= s <= 1 for s in sims)
        assert verdict.kept.duration == pytest.approx(len(res.codes) // FRAME * 2048 / 24_000, abs=1e-3)


def test_a_long_orpheus_text_is_split_and_joined_at_frame_boundaries(orpheus64):
    from engine.config import TextSpec

    long_text = " ".join(TEXTS[1:3])
    settings = DecodingSettings(method="ar", max_new_tokens=250, seed=2)
    (res,), _ = orpheus64.synthesize([SynthesisItem(long_text, id="long")], settings, text=TextSpec(split="auto"))
    assert res.error is None and res.chunks and len(res.chunks) > 1
    assert sum(c["num_codes"] for c in res.chunks) == len(res.codes)
    assert all(c["num_codes"] % FRAME == 0 for c in res.chunks) and len(res.codes) % FRAME == 0
    assert all(0 <= c < CODEBOOK for c in res.codes)
