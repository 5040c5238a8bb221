"""pcg-synth: batch speech synthesis with speculative decoding (PCG). Quiet by default: -v for more."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
from dataclasses import fields
from pathlib import Path

from pydantic import ValidationError

from engine.cli_options import (
    add_compile_arg,
    add_draft_weights_arg,
    add_family_arg,
    add_settings_arguments,
    settings_from_args,
)
from engine.config import ADMISSIONS, METHODS, DecodingSettings, QualitySpec, TextSpec, accepted_keys, decoding_default
from engine.console import counted
from engine.errors import did_you_mean, plain_message


class UsageError(Exception):
    """A user mistake; printed as one line, exit status 2."""


def format_validation(exc: ValidationError) -> str:
    """One line naming every bad field; a key no setting has gets the one it most likely meant
    (`decoding.max_new_token: no such setting (did you mean 'max_new_tokens'?)`), else the
    keys accepted there."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(x) for x in err["loc"]) or "settings"
        msg = plain_message(err["msg"])
        if err["type"] == "extra_forbidden" and err["loc"]:
            known = accepted_keys(exc.title, err["loc"][:-1])
            hint = did_you_mean(str(err["loc"][-1]), known)
            msg = "no such setting" + (hint or (f" (accepted here: {', '.join(known)})" if known else ""))
        parts.append(f"{field}: {msg}")
    return "invalid settings: " + "; ".join(parts)


# ---- kit ---------------------------------------------------------------------------------------


def cmd_kit_build(args) -> int:
    from engine.kit import KitSpec, build_kit

    out = build_kit(args.dir, KitSpec(seed=args.seed), force=args.force, family=args.family)
    manifest = json.loads((out / "kit.json").read_text())
    print(f"tiny {manifest['family']} kit written to {out} (sha256 {manifest['sha256'][:16]}...)")
    for part in ("target", "draft", "streams", "codec"):
        if (out / part).is_dir():
            print(f"  {part:7s} {out / part}")
    return 0


# ---- generate ----------------------------------------------------------------------------------


def text_id(n: int, text: str) -> str:
    """An id for a text given without one: its number and first words (`003-hello-there`), so
    `--wav-dir` files say what they hold."""
    words = "-".join(re.findall(r"[a-z0-9]+", text.lower())[:5])[:40].strip("-")
    return f"{n:03d}-{words}" if words else f"{n:03d}"


def read_items(args) -> list:
    """Items from --text and --texts-file; `.jsonl` rows may name a voice-prompt clip
    (`prompt_audio`), returned separately as {item index: clip path}. Texts without an id get
    `text_id`'s."""
    from engine.records import SynthesisItem

    item_keys = {f.name for f in fields(SynthesisItem)} | {"prompt_audio"}
    items = [SynthesisItem(text=t) for t in args.text or []]
    clips: dict[int, str] = {}
    if args.texts_file:
        path = Path(args.texts_file)
        if not path.is_file():
            raise UsageError(f"--texts-file {path} does not exist")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    row = json.loads(line)
                    unknown = sorted(set(row) - item_keys) if isinstance(row, dict) else []
                    if unknown:
                        raise UsageError(f"{path}:{n}: {unknown[0]!r} is not an item field"
                                         + (did_you_mean(unknown[0], item_keys)
                                            or f" (fields: {', '.join(sorted(item_keys))})"))
                    clip = row.pop("prompt_audio", None)
                    if clip is not None:
                        clips[len(items)] = str(path.parent / clip)
                    items.append(SynthesisItem(**row))
                except (json.JSONDecodeError, TypeError, AttributeError) as exc:
                    raise UsageError(f"{path}:{n}: not a valid item ({exc})") from exc
            else:
                items.append(SynthesisItem(text=line.strip()))
    if not items:
        raise UsageError("give texts with --text or --texts-file")
    for n, item in enumerate(items):
        if item.id is None:
            item.id = text_id(n, item.text)
    return items, clips


def resolve_clips(items: list, clips: dict[int, str], codec) -> None:
    """Encode voice-prompt clips (cached by content) into the items' prompt codes."""
    from engine.codec.prompts import PromptCache, load_voice_prompt

    cache = PromptCache()
    for i, clip in clips.items():
        prompt = load_voice_prompt(items[i].prompt_text or "", audio=clip, codec=codec, cache=cache)
        items[i].prompt_codes = list(prompt.codes)


def summary_table(summaries: list[dict]) -> str:
    head = f"{'method':7s} {'ok':>4s} {'tokens':>7s} {'tok/s':>8s} {'acc.len':>7s}  acceptance by position"
    lines = [head, "-" * len(head)]
    for s in summaries:
        acc = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"]) or "-"
        lines.append(f"{s['method']:7s} {s['ok']:4d} {s['generated_tokens']:7d} "
                     f"{s['tokens_per_s']:8.1f} {s['mean_accepted_length']:7.3f}  {acc}")
    return "\n".join(lines)


AUDIO_FILES = ("wav", "flac")  # `--out hello.wav`: the one text's clip


def output_kind(out: str | None, texts: int = 1) -> str | None:
    """What `--out` writes, from its suffix: `json`, `parquet`, or an audio file (`wav`, `flac`),
    which holds the clip of one text.

    Raises:
        UsageError: another suffix, or an audio file for several texts.
    """
    if out is None:
        return None
    kind = Path(out).suffix.lower()[1:]
    if kind not in ("json", "parquet", *AUDIO_FILES):
        raise UsageError(f"--out {out}: use a .json (codes + statistics), .parquet (audio dataset) "
                         "or .wav/.flac (the clip of one text) path")
    if kind in AUDIO_FILES and texts > 1:
        raise UsageError(f"--out {out} holds the clip of one text and {texts} were given: use --wav-dir DIR "
                         "(a file per text) or --out FILE.parquet")
    return kind


def per_method(path: Path, method: str, several: bool) -> Path:
    """`out.parquet` -> `out.pcg.parquet` when several methods write."""
    return path.with_name(f"{path.stem}.{method}{path.suffix}") if several else path


def rejected_path(path: Path) -> Path:
    """`out.parquet` -> `out.rejects.parquet`: where the quality gate's rejected texts go."""
    return path.with_name(f"{path.stem}.rejects{path.suffix}")


def write_audio(args, kind: str | None, items, settings, results, codec, several: bool,
                gate: QualitySpec | None = None) -> None:
    """The results' audio to --out / --wav-dir; with the quality gate, its rejected texts to
    `X.rejects.parquet` / `DIR/rejects/` (or nowhere: `--on-reject drop`)."""
    rejected = [i for i, r in enumerate(results) if r.quality is not None and not r.quality.passed]
    if rejected:
        apart = gate is not None and gate.on_reject == "rejects"
        if apart:
            where = argparse.Namespace(**{**vars(args), "out": args.out and str(rejected_path(Path(args.out))),
                                          "wav_dir": args.wav_dir and str(Path(args.wav_dir) / "rejects")})
            export_results(where, kind, [items[i] for i in rejected], settings, [results[i] for i in rejected],
                           codec, several)
        print(f"[{settings.method}] quality gate: {counted(len(rejected), 'text')} rejected"
              + (" (written apart: .rejects)" if apart else " (dropped)"), file=sys.stderr)
        kept = [i for i in range(len(results)) if i not in set(rejected)]
        items, results = [items[i] for i in kept], [results[i] for i in kept]
    if results:
        export_results(args, kind, items, settings, results, codec, several)


def export_results(args, kind: str | None, items, settings, results, codec, several: bool) -> None:
    """`results`' audio where `args` says (--out, --wav-dir; one file per method when `several`)."""
    from engine.codec.export import AudioOutput, export_audio, file_name
    from engine.codec.prompts import prompts_of

    parquet = per_method(Path(args.out), settings.method, several) if kind == "parquet" else None
    wav_dir = Path(args.wav_dir) / settings.method if (args.wav_dir and several) else args.wav_dir
    prompts = prompts_of(items)
    if parquet or wav_dir:
        output = AudioOutput(parquet, wav_dir, args.audio_format, args.prompt_audio,
                             quality=any(r.quality for r in results))
        done = export_audio(results, settings, codec, output, prompts=prompts)
        where = " and ".join(str(x) for x in (done["parquet"], done["wav_dir"]) if x)
        print(f"[{settings.method}] {done['with_audio']} clips, {done['audio_seconds']:.1f} s of audio "
              f"written to {where}")
    if kind in AUDIO_FILES:  # the one clip, through a folder next to the file, then renamed into place
        path = per_method(Path(args.out), settings.method, several)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".pcg-synth-") as folder:
            output = AudioOutput(wav_dir=folder, audio_format=kind, prompt_audio=args.prompt_audio)
            done = export_audio(results, settings, codec, output, prompts=prompts)
            if done["with_audio"]:
                os.replace(Path(folder) / file_name(results[0].id, kind), path)
                print(f"[{settings.method}] {done['audio_seconds']:.1f} s of audio written to {path}")
            else:
                print(f"[{settings.method}] no audio for {path}: the text failed (above)", file=sys.stderr)


DRAFTERS = ("model", "streams")  # `--drafter`: a draft model, or stream heads on the target


def drafter_path(args) -> Path | str | None:
    """The drafter `generate` loads: `--draft` (whose files say which kind it is; a local one is
    checked against `--drafter` here, a Hub model or URI once loaded), else the kit's `draft/`
    or, with `--drafter streams`, its `streams/`.

    Raises:
        UsageError: `--drafter` names another kind than `--draft` holds, or the kit has no
            `streams/`.
    """
    if not (args.draft or args.kit):
        return None
    from engine.models.streams import is_streams_dir  # torch: only where a drafter will load

    if args.draft:
        local = Path(args.draft)
        if args.drafter and local.is_dir():
            holds = "streams" if is_streams_dir(local) else "model"
            if holds != args.drafter:
                raise UsageError(f"--drafter {args.drafter} but --draft {args.draft} holds "
                                 + ("stream heads (pcg_streams.json)" if holds == "streams" else "a draft model")
                                 + f": use --drafter {holds}, or leave --drafter out (the path decides)")
        return args.draft
    if args.drafter == "streams":
        heads = Path(args.kit) / "streams"
        if not is_streams_dir(heads):
            raise UsageError(f"--drafter streams: the kit {args.kit} has no stream heads ({heads}/pcg_streams.json "
                             f"is missing); rebuild it with `pcg-synth kit build {args.kit} --force`, give "
                             "--draft HEADS_DIR (`pcg-synth draft train --kind streams`), or use --drafter model")
        return heads
    return Path(args.kit) / "draft"


def cmd_generate(args) -> int:
    method = args.method or decoding_default("method")
    methods = METHODS if method == "all" else [method]
    # validated before anything loads
    all_settings = [settings_from_args(args, DecodingSettings, method=m) for m in methods]
    quality = settings_from_args(args, QualitySpec)
    text = settings_from_args(args, TextSpec)
    items, clips = read_items(args)
    for item in items:  # --voice: the named voice of every text that names none
        item.voice = item.voice or args.voice
    kind = output_kind(args.out, len(items))
    if args.kit and not (Path(args.kit) / "target").is_dir():
        raise UsageError(f"--kit {args.kit}: not a tiny kit (no target/ in it); build one with "
                         f"`pcg-synth kit build {args.kit}`")
    target = args.target or (Path(args.kit) / "target" if args.kit else None)
    draft = drafter_path(args)
    codec_dir = args.codec or (Path(args.kit) / "codec" if args.kit else None)
    if target is None:
        raise UsageError("give --kit DIR or --target DIR (and --draft DIR)")
    if draft is None and any(s.speculative for s in all_settings):
        raise UsageError(f"method {method!r} needs a draft model or stream heads: give --draft DIR "
                         "(or use --method ar)")
    audio = kind in ("parquet", *AUDIO_FILES) or bool(args.wav_dir)
    if (audio or clips or quality.enabled) and codec_dir is None:
        raise UsageError(("writing audio" if audio else "items naming voice-prompt clips" if clips
                          else "the quality gate (it listens to the audio)")
                         + " needs the model's codec (X-codec2 for Llasa, SNAC for Orpheus): give --codec DIR "
                           "(or --kit DIR)")
    from engine.io.storage import Storage
    from engine.runtime.preflight import check_normalizer_installed, check_verifiers, check_writable

    check_normalizer_installed(text)  # a missing normaliser or verifier fails before anything loads
    if quality.enabled:
        check_verifiers(quality, Storage())
    from engine.api import COMPARE_WARMUP_TOKENS, Synthesizer  # torch: only once the arguments are known to be good

    codec = gate = None
    if audio or clips or quality.enabled:  # first: a bad codec fails before the models load and the texts decode
        from engine.codec.load import load_codec

        codec = load_codec(codec_dir, device=args.device, encoder_device=args.device)
    if quality.enabled:
        from engine.metrics.gate import QualityGate
        from engine.models.device import resolve_device

        gate = QualityGate.load(quality, codec, device=str(resolve_device(args.device)))
    for flag, given, folder in (("--out", args.out, args.out and Path(args.out).parent),
                                ("--wav-dir", args.wav_dir, args.wav_dir)):
        if folder:  # an output this process cannot write fails before the models load
            check_writable(Storage(), str(Path(folder).absolute()), f"{flag} {given}: cannot write under {folder}")
    synth = Synthesizer.load(target, draft=draft, device=args.device, dtype=args.dtype,
                             compile=args.compile, draft_weights=args.draft_weights, family=args.family,
                             batch_size=args.batch_size)
    if args.drafter and synth.drafter_kind not in (None, args.drafter):  # a Hub model or URI, known once loaded
        raise UsageError(f"--drafter {args.drafter} but --draft {draft} holds "
                         + ("stream heads" if synth.drafter_kind == "streams" else "a draft model")
                         + f": use --drafter {synth.drafter_kind}, or leave --drafter out")
    if codec is not None:
        synth.family.check_codec(codec, f"--codec {codec_dir}")
    if clips:
        resolve_clips(items, clips, codec)
    if len(all_settings) > 1:  # comparing rules: none is timed with the process's first-run costs
        synth.warmup_each(all_settings)
    runs, said, cut = [], set(), {}
    for settings in all_settings:
        results, summary = synth.synthesize(items, settings, progress=not args.quiet, admission=args.admission,
                                            quality=gate, text=text)
        runs.append({"summary": summary.to_dict(),
                     "items": [{**r.to_dict(), "prompt_text": it.prompt_text, "prompt_codes": it.prompt_codes}
                               for r, it in zip(results, items)]})
        for r in results:
            if r.error and (r.id, r.error) not in said:  # a text every rule refuses is said once
                said.add((r.id, r.error))
                print(f"item {r.id}: {r.error}", file=sys.stderr)
        cut[settings.method] = summary.cut
        if summary.quality:
            q = summary.quality
            print(f"[{settings.method}] quality gate: {q['passed']} passed, {q['rejected']} rejected, "
                  f"{q['regenerated']} regenerated, {q['decodes']} decodes; checking took {q['verify_s']} s",
                  file=sys.stderr)
        if audio:
            write_audio(args, kind, items, settings, results, codec, len(all_settings) > 1,
                        quality if quality.enabled else None)
    if any(cut.values()):  # said once for all the rules: they share the limits
        settings, texts = all_settings[0], counted(len(items), "text")
        ratio = settings.max_speech_ratio
        counts = (f"[{settings.method}] {cut[settings.method]} of {texts} reached the token limit before the "
                  "end of speech" if len(cut) == 1 else
                  f"texts that reached the token limit before the end of speech, of {len(items)}: "
                  + ", ".join(f"{method} {n}" for method, n in cut.items() if n))
        print(f"{counts} (max_new_tokens {settings.max_new_tokens} or an item's own, "
              + (f"max_speech_ratio {ratio} times the text's estimated time + 2 s, " if ratio else "")
              + "or the model's context): their audio is cut there; raise --max-new-tokens"
              + (" or --max-speech-ratio" if ratio else ""), file=sys.stderr)
    summaries = [r["summary"] for r in runs]
    print(summary_table(summaries))
    outlook = None
    if len(all_settings) > 1 and synth.drafter is not None:  # comparing rules: say what speed to expect
        from engine.decoding.cost import speculation_outlook

        gamma = next(s.gamma for s in all_settings if s.speculative)
        if not isinstance(gamma, int):  # auto: the default's, within what stream heads propose
            gamma = min(decoding_default("gamma"), synth.max_gamma or decoding_default("gamma"))
        context = int(sum(len(synth.prompter.build(it.text)) for it in items) / max(len(items), 1))
        outlook = speculation_outlook(synth.target.model, synth.drafter, gamma, context + 32, {
            s["method"]: s["mean_accepted_length"] for s in summaries if s["method"] != "ar"})
        print(outlook)
    if kind == "json":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"target": str(target), "draft": str(draft) if draft else None, "drafter": synth.drafter_kind,
               "device": str(synth.device), "runs": runs, "outlook": outlook,
               "warmup_tokens": COMPARE_WARMUP_TOKENS if len(all_settings) > 1 else 0}
        out.write_text(json.dumps(doc, indent=1))
        print(f"codes and statistics written to {out}")
    return 0


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="synthesize speech codes for texts on this machine",
                       description="Decode texts into speech codes (X-codec2 for Llasa, SNAC for Orpheus) "
                                   "with a target and a drafter (a draft model or stream heads); prints "
                                   "per-method statistics; --out writes the codes (JSON), an audio dataset "
                                   "(Parquet) or one text's clip (WAV/FLAC).")
    src = p.add_argument_group("models")
    src.add_argument("--kit", help="a tiny kit directory (uses its target and draft, or its streams with "
                                   "--drafter streams)")
    src.add_argument("--target", help="target checkpoint (Hugging Face Llama format): a directory, a Hub "
                                      "model id such as HKUSTAudio/Llasa-1B[@revision] or "
                                      "canopylabs/orpheus-3b-0.1-ft, or an s3:// / gs:// / ... URI")
    src.add_argument("--draft", help="draft checkpoint, same forms as --target (same vocabulary as the target), "
                                     "or a directory of stream heads made for the target (`pcg-synth draft train "
                                     "--kind streams`; gamma at most their count)")
    src.add_argument("--drafter", choices=DRAFTERS,
                     help="what drafts: model (a draft model: the kit's draft/) or streams (stream heads on the "
                          "target: the kit's streams/); with --draft the path decides and this must agree "
                          "(default: model with --kit, else what --draft holds)")
    src.add_argument("--codec", help="the family's codec checkpoint, same forms (HKUSTAudio/xcodec2-hf for Llasa, "
                                     "hubertsiuzdak/snac_24khz for Orpheus; for audio output and clips)")
    src.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    src.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    add_family_arg(src)
    add_compile_arg(src)
    add_draft_weights_arg(src)
    src.add_argument("--batch-size", type=int, default=8, help="texts decoded together (continuous batching)")
    src.add_argument("--admission", default="longest_first", choices=ADMISSIONS,
                     help="which queued text takes a free batch slot: longest_first (longest expected "
                          "speech first, default) or arrival (input order); outputs are the same")
    inp = p.add_argument_group("input")
    inp.add_argument("--text", action="append", help="a text to speak (repeatable)")
    inp.add_argument("--voice", help="a named voice of the model for every text that names none (Orpheus's -ft "
                                     "checkpoints: tara, leah, jess, leo, dan, mia, zac, zoe; Llasa has none)")
    inp.add_argument("--texts-file", help="one text per line, or .jsonl items {id, text, prompt_text, "
                                          "prompt_codes | prompt_audio (a clip path), voice, seed} with "
                                          "optional per-item temperature, top_p, top_k, "
                                          "repetition_penalty, max_new_tokens")
    txt = p.add_argument_group("texts (a job's `text:` section; docs/guides/long-texts-and-formats.md): a "
                               "text too long for --max-new-tokens and the model's context is cut into "
                               "chunks decoded beside the others, their audio joined back into its clip")
    add_settings_arguments(txt, TextSpec, include=["split", "normalize", "normalizer", "language"])
    dec = p.add_argument_group("decoding (DecodingSettings; --method all: every rule in turn, each warmed up first)")
    add_settings_arguments(dec, DecodingSettings, extra_choices={"method": ["all"]})
    out = p.add_argument_group("output")
    out.add_argument("--out", help="FILE.json: codes + statistics; FILE.parquet: an audio dataset; "
                                   "FILE.wav or FILE.flac: the clip of one text (one file per method, "
                                   "FILE.METHOD.parquet/.wav, with --method all)")
    out.add_argument("--wav-dir", help="also write one audio file per item here, named by the item's id "
                                       "(texts without one: NNN-first-words), DIR/METHOD/ with --method all")
    out.add_argument("--audio-format", default="wav", choices=["wav", "flac"], help="audio file format")
    out.add_argument("--prompt-audio", default="strip", choices=["strip", "include", "context"],
                     help="voice-prompt audio in the output: strip (default), include it, or decode "
                          "with it as context and cut it")
    gate = p.add_argument_group("quality gate (a job's `quality:` section; docs/guides/quality.md): each "
                                "text's audio is checked; one that fails is decoded again (--attempts) or "
                                "chosen among candidates (--best-of); texts that never pass go to "
                                "X.rejects.parquet / DIR/rejects/ (or are dropped)")
    add_settings_arguments(gate, QualitySpec, exclude=("reject_truncated",))
    gate.add_argument("--reject-truncated", action="store_true", default=None,
                      help=QualitySpec.model_fields["reject_truncated"].description)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)


# ---- jobs -------------------------------------------------------------------------------------


def cmd_run(args) -> int:
    from engine.config import JobSpec

    spec = JobSpec.load(args.spec)  # an invalid spec fails here, before torch and Ray load
    from engine.runtime.preflight import dry_run, dry_run_text, preflight

    if args.gpu and not args.dry_run:
        raise UsageError("--gpu sizes a dry run's workers: add --dry-run")

    if args.dry_run:
        report = dry_run(spec, allow_numerics_change=args.allow_numerics_change, gpu=args.gpu)
        print(json.dumps(report) if args.quiet else dry_run_text(report))
        return 0
    from engine.io.storage import Storage

    # a missing model fails here too, before torch and Ray load (the output folder is made by the
    # job itself: one refused before any work leaves none)
    preflight(spec, Storage(spec.storage), create=False)
    if spec.kind == "sweep":
        from engine.runtime.sweep import run_sweep

        doc = run_sweep(spec, address=args.address, progress=not args.quiet, wait=args.wait)
        if args.quiet:
            print(json.dumps({"job": spec.name, "output": spec.output.uri, "runs": len(doc["runs"]),
                              "plots": doc["plots"]}))
        return 0
    from engine.runtime.job import JobRunner

    summary = JobRunner(spec, address=args.address, progress=not args.quiet,
                        allow_numerics_change=args.allow_numerics_change, wait=args.wait,
                        rerun=shlex.join(["pcg-synth", *args.argv])).run()
    if args.quiet:
        print(json.dumps({k: summary[k] for k in ("job", "output", "rows_ok", "rows_failed", "audio_seconds")}))
    return 0


def cmd_submit(args) -> int:
    from engine.runtime.submit import submit

    job_id = submit(args.spec, args.address, args.runtime_env, dry_run=args.dry_run)
    print(f"submitted {job_id}{' (a dry run)' if args.dry_run else ''}\n"
          f"  follow: pcg-synth status {job_id} --address {args.address} --wait")
    return 0


def cmd_status(args) -> int:
    from engine.runtime.submit import status

    state, tail = status(args.job_id, args.address, wait=args.wait)
    print(f"{args.job_id}: {state}\n{tail}")
    return 0 if state in ("SUCCEEDED", "RUNNING", "PENDING") else 1


def add_jobs(sub) -> None:
    p = sub.add_parser("run", help="run a synthesis job spec on Ray (a local cluster by default)",
                       description="Validate JOB.yaml, plan shards over its manifests, run synthesis "
                                   "workers on Ray and write an Arrow/Parquet audio dataset with "
                                   "summary.json. Rerunning resumes: committed shards are skipped.")
    p.add_argument("spec", help="job spec (YAML); see jobs/quickstart.yaml")
    p.add_argument("--address", help="Ray cluster address (auto: the running cluster, ray://HEAD:10001); "
                                      "default: $RAY_ADDRESS if set, else a fresh local Ray")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table; print a JSON line")
    p.add_argument("--allow-numerics-change", action="store_true",
                   help="resume an output written under another numerics environment (device type, "
                        "torch version, threads per worker); recorded in _job.json and the summary")
    p.add_argument("--dry-run", action="store_true",
                   help="check the job without models, Ray or writing: models and output reachable, "
                        "every manifest row validated, the plan and what the output holds; print it")
    p.add_argument("--gpu", metavar="NAME",
                   help="with --dry-run: size the workers for this GPU (H100, H200, A100-80GB, A100-40GB, L40S, "
                        "A10G, L4, RTX 4090, ...: docs/sizing.md); without it, for cards of 24, 40 and 80 GB")
    p.add_argument("--wait", action="store_true",
                   help="if another driver is writing the same output (it holds the output's lease), wait "
                        "for it to end, then go on (typically finding the job finished and printing its "
                        "summary); without it the run refuses at once (exit status 75)")
    p.set_defaults(func=cmd_run)
    s = sub.add_parser("submit", help="submit a job spec to a Ray cluster (Ray Jobs API)",
                       description="Validate JOB.yaml here, upload it and run `pcg-synth run` on the "
                                   "cluster. Paths in the spec must be s3:// URIs or exist on every node.")
    s.add_argument("spec", help="job spec (YAML), validated here before it is uploaded")
    s.add_argument("--address", required=True, help="the cluster's dashboard, e.g. http://HEAD:8265")
    s.add_argument("--runtime-env", default=None, help="runtime env YAML (see cluster/runtime-env.yaml)")
    s.add_argument("--dry-run", action="store_true",
                   help="run `pcg-synth run --dry-run` on the cluster instead: the job checked where it will "
                        "run (its paths, its credentials), nothing decoded or written; `status` shows the report")
    s.set_defaults(func=cmd_submit)
    st = sub.add_parser("status", help="status and log tail of a submitted job")
    st.add_argument("job_id", help="the submission id `submit` printed")
    st.add_argument("--address", required=True, help="the cluster's dashboard, e.g. http://HEAD:8265")
    st.add_argument("--wait", action="store_true", help="block until the job ends")
    st.set_defaults(func=cmd_status)


# ---- convert ----------------------------------------------------------------------------------


def cmd_convert(args) -> int:
    from engine.config import StorageOptions
    from engine.runtime.convert import convert

    storage = StorageOptions(**{k: getattr(args, k) for k in ("endpoint_url", "region", "profile")
                                if getattr(args, k)})
    done = convert(args.output, args.to, dest=args.dest, tarred=args.tarred, storage_options=storage,
                   progress=not args.quiet)
    if args.quiet:
        print(json.dumps(done))
        return 0
    print(f"{done['dest']}: {args.to}{' (tarred)' if args.tarred else ''}, {counted(done['shards'], 'shard')} "
          f"({done['converted']} converted now, {done['skipped']} already), {done['with_audio']} clips, "
          f"{done['audio_seconds']:.1f} s of audio, {counted(done['failed'], 'error row')} (in errors/)")
    for uri in done["files"]:
        print(f"  {uri}")
    return 0


def add_convert(sub) -> None:
    from engine.config import OUTPUT_FORMATS

    p = sub.add_parser("convert", help="rewrite a finished job output in another format (no decoding)",
                       description="Read a finished hf-parquet job output (local or s3://) and write it as "
                                   "NeMo manifests with audio (plain or tarred) or Lhotse Shar, shard by "
                                   "shard with a commit record each: rerunning resumes, and a finished "
                                   "conversion run again changes nothing.")
    p.add_argument("output", help="the job's output directory or s3:// prefix (output.uri)")
    p.add_argument("--to", required=True, choices=[f for f in OUTPUT_FORMATS if f != "hf-parquet"],
                   help="the format to write")
    p.add_argument("--dest", help="where to write (default: OUTPUT-FORMAT beside OUTPUT)")
    p.add_argument("--tarred", action="store_true",
                   help="nemo: tarred audio shards (audio_N.tar + sharded_manifests/), as NeMo's tarred datasets")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://minio:9000 (unset: AWS S3)")
    p.add_argument("--region", help="AWS region of the bucket(s)")
    p.add_argument("--profile", help="AWS profile name from ~/.aws")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print a JSON line")
    p.set_defaults(func=cmd_convert)


def add_verbose(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """`-v/--verbose` on `parser` and every command under it (before or after the command)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="progress bars also outside a terminal, and the libraries' (Ray, "
                             "transformers) own notices; default: quiet")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                add_verbose(child)


def build_parser() -> argparse.ArgumentParser:
    from engine import __version__

    parser = argparse.ArgumentParser(prog="pcg-synth", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pcg-synth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    kit = sub.add_parser("kit", help="the tiny model kit").add_subparsers(dest="kit_cmd", required=True)
    kb = kit.add_parser("build", help="write the tiny kit (target, draft, codec, tokenizer)")
    kb.add_argument("dir", help="where to write the kit")
    kb.add_argument("--seed", type=int, default=0, help="the seed every weight is drawn from")
    kb.add_argument("--force", action="store_true", help="replace an existing kit")
    kb.add_argument("--family", default="llasa", choices=["llasa", "orpheus"],
                    help="the model family: llasa (target, draft, X-codec2; the quickstart's) or orpheus "
                         "(target and draft in Orpheus's token layout, SNAC 24 kHz)")
    kb.set_defaults(func=cmd_kit_build)
    add_generate(sub)
    add_jobs(sub)
    add_convert(sub)
    from engine.bench.cli import register as register_bench
    from engine.codec.cli import register as register_codec
    from engine.draft.cli import register as register_draft
    from engine.groups.cli import register as register_groups
    from engine.report.cli import register as register_report

    register_codec(sub)
    register_groups(sub)
    register_draft(sub)
    register_bench(sub)
    register_report(sub)
    add_verbose(parser, top=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.errors import raise_terminated

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if main_thread else None
    try:
        return run_command(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_command(argv: list[str] | None) -> int:
    """`main` without the SIGTERM handler: parse, run, and turn the errors users meet into one
    line and an exit code."""
    from engine import console
    from engine.errors import TERMINATED, ClusterUnreachable, GroupBuildError, JobFailed, ModelLoadError, Terminated
    from engine.io.lease import LEASE_EXIT_CODE, LeaseHeld
    from engine.io.storage import StorageError

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the line that says how to rerun
    console.configure(verbose=args.verbose)
    try:
        return args.func(args)
    except ValidationError as exc:
        print(f"error: {format_validation(exc)}", file=sys.stderr)
    except LeaseHeld as exc:  # the output is in use: try again later
        print(f"error: {exc}", file=sys.stderr)
        return LEASE_EXIT_CODE
    except (UsageError, ModelLoadError, FileExistsError, ValueError, StorageError, ClusterUnreachable) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except (JobFailed, GroupBuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file the system refused mid-way (disk full, permissions): one line
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated) or TERMINATED.is_set()  # Ray's waits re-raise it plainly
        stopped = "terminated (SIGTERM)" if terminated else "interrupted"
        print(f"{stopped}: committed shards are kept; rerun the same command to resume", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    return 2


if __name__ == "__main__":
    sys.exit(main())
