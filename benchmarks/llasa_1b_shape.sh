#!/usr/bin/env bash
# Speculation at Llasa-1B's shape, start to end: the llasa-1b-shape target (Llasa-1B dimensions,
# random weights, deterministic), target samples, a 3-layer draft distilled against it, stream
# heads distilled on the same samples, draft acceptance before/after on held-out texts, then
# `pcg-synth bench` with the distilled draft and `bench_drafters.py` (the draft against the heads).
# Results land in benchmarks/results/ (commit them).
#
#   bash benchmarks/llasa_1b_shape.sh               # CPU profile: dtype auto (bfloat16 where the CPU
#                                                   # has native bf16), the draft's chain sized for an
#                                                   # hour on 2 cores (the stream heads' stages add to it)
#   DEVICE=cuda bash benchmarks/llasa_1b_shape.sh   # GPU profile: the paper-scale recipe
#
# Every step is deterministic (fixed seeds, fixed step counts; no time budget). Rerunning resumes
# the distillation from its last checkpoint. Overrides (environment): WORK (scratch dir), DEVICE,
# DTYPE, SEEDS (target samples per training text), MAX_NEW (tokens per sample), STEPS, BATCH, LR,
# LAYERS, DRAFT_WEIGHTS (the bench's draft: int8 on a CPU with VNNI/AMX int8, else native), BATCHES, GAMMAS, THETAS, REPS, ITEMS (bench items per batch slot), COST_REPS, EVAL_TOKENS,
# EVAL_TEXTS (a texts file; default: the built-in held-out texts), BENCH=0 (stop before the benches), OUT (result-file stem), TARGET (an existing
# target directory instead of the preset: e.g. a tiny kit's target/, which is how the tests run
# this chain in seconds). Stream heads: HEADS (their count: the largest gamma they draft),
# STREAM_STEPS and ANCHORS (their distillation's steps and anchor positions per step), DRAFTERS=0
# (neither the heads nor bench_drafters.py), DRAFTERS_OUT (its result stem; default OUT's
# directory and name with drafters_ in front: benchmarks/results/drafters_llasa_1b_shape_<device>_<dtype>).
case "${1:-}" in -h|--help) sed -n "2,$((LINENO - 1))p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
PCG=${PCG:-.venv/bin/pcg-synth}
PY=${PY:-.venv/bin/python}
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" = cpu ]; then  # 2 cores: short samples, one epoch (a 2nd overfits: more samples help, more steps do not)
  DTYPE=${DTYPE:-auto}; SEEDS=${SEEDS:-32}; MAX_NEW=${MAX_NEW:-128}; STEPS=${STEPS:-120}
  BATCH=${BATCH:-8}; LR=${LR:-3e-5}; BATCHES=${BATCHES:-1,2,4,8}; REPS=${REPS:-2}; ITEMS=${ITEMS:-1}
  CACHE=--cache-target; GEN_BATCH=32; CKPT=40
  # a step sends each anchor through the 65,537-row output head twice per head (the head's logits
  # and the teacher's), which a CPU pays for at Llasa's width: fewer steps and anchors than a GPU's
  STREAM_STEPS=${STREAM_STEPS:-200}; ANCHORS=${ANCHORS:-64}
  # the bench's draft: int8 halves its step's bytes, where the CPU has VNNI/AMX int8 (docs/guides/drafts.md)
  DRAFT_WEIGHTS=${DRAFT_WEIGHTS:-$($PY -c 'from engine.models.quant import cpu_vnni; print("int8" if cpu_vnni() else "native")')}
else
  DTYPE=${DTYPE:-auto}; SEEDS=${SEEDS:-16}; MAX_NEW=${MAX_NEW:-256}; STEPS=${STEPS:-1500}
  BATCH=${BATCH:-16}; LR=${LR:-1e-3}; BATCHES=${BATCHES:-1,2,4,8,16,32,64}; REPS=${REPS:-3}
  CACHE=; GEN_BATCH=64; CKPT=500
  STREAM_STEPS=${STREAM_STEPS:-2000}; ANCHORS=${ANCHORS:-256}
  DRAFT_WEIGHTS=${DRAFT_WEIGHTS:-native}  # int8 draft weights are a CPU (oneDNN) path
fi
LAYERS=${LAYERS:-0,1,15}
GAMMAS=${GAMMAS:-2,3,4,auto}
THETAS=${THETAS:-0.3,0.4,0.5}
EVAL_TOKENS=${EVAL_TOKENS:-128}
EVAL_TEXTS=${EVAL_TEXTS:+--texts-file $EVAL_TEXTS}
ITEMS=${ITEMS:-2}
COST_REPS=${COST_REPS:-10}
HEADS=${HEADS:-4}
DRAFTERS=${DRAFTERS:-1}
if [ "$DTYPE" = auto ]; then  # what `dtype: auto` picks here (bfloat16 only with native bf16 on a CPU)
  DTYPE=$("$PY" -c "import sys, torch; from engine.models.device import auto_dtype
print(str(auto_dtype(torch.device(sys.argv[1]))[0]).removeprefix('torch.'))" "$DEVICE")
fi
SUFFIX=$(echo "$DEVICE" | tr -d ':')_$(echo "$DTYPE" | sed 's/bfloat16/bf16/; s/float32/fp32/; s/float16/fp16/')
WORK=${WORK:-work/llasa-1b-shape}
OUT=${OUT:-benchmarks/results/llasa_1b_shape_$SUFFIX}
DRAFTERS_OUT=${DRAFTERS_OUT:-$(dirname "$OUT")/drafters_$(basename "$OUT")}
mkdir -p "$WORK" "$(dirname "$OUT")"
SECONDS=0
stage() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }

if [ -z "${TARGET:-}" ]; then
  # 1. the preset's target on disk (deterministic: seed 0); its untrained 3-layer draft is the
  #    "before" of step 4
  stage "llasa-1b-shape target -> $WORK/target"
  "$PY" - "$WORK" "$DEVICE" <<'PYEOF'
import sys
from pathlib import Path
import torch
from engine.bench.presets import ModelBuild, llasa_1b_shape
if not (Path(sys.argv[1]) / "target" / "config.json").is_file():
    llasa_1b_shape(ModelBuild(torch.device("cpu"), torch.bfloat16), save_to=Path(sys.argv[1]))
PYEOF
  TARGET=$WORK/target
fi

# 2. target samples: every training text under SEEDS seeds (`ar`, temperature 0.8)
stage "target samples: $SEEDS per training text, $MAX_NEW tokens"
"$PY" - "$WORK/texts.jsonl" "$SEEDS" <<'PYEOF'
import json, sys
from engine.kit.draft import KIT_TRAIN_TEXTS
with open(sys.argv[1], "w") as f:
    for seed in range(int(sys.argv[2])):
        for i, text in enumerate(KIT_TRAIN_TEXTS):
            f.write(json.dumps({"id": f"t{i}-s{seed}", "text": text, "seed": 1000 + seed}) + "\n")
PYEOF
SAMPLES=$WORK/samples-s$SEEDS-n$MAX_NEW.json  # deterministic: made once per setting
[ -s "$SAMPLES" ] || "$PCG" generate --target "$TARGET" --texts-file "$WORK/texts.jsonl" --method ar \
    --temperature 0.8 --max-new-tokens "$MAX_NEW" --batch-size "$GEN_BATCH" --device "$DEVICE" \
    --dtype "$DTYPE" --out "$SAMPLES" --quiet

# 3. the draft: a layer subset, then knowledge distillation (rerunning resumes)
stage "draft: layers $LAYERS, $STEPS distillation steps"
"$PCG" draft init --target "$TARGET" --layers "$LAYERS" --out "$WORK/draft-init" --force --quiet
"$PCG" draft train --data "$SAMPLES" --draft "$WORK/draft-init" --target "$TARGET" \
    --out "$WORK/draft-kd" --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" \
    --eval-every $(( STEPS < 50 ? STEPS : 50 )) --checkpoint-every "$CKPT" --device "$DEVICE" \
    --dtype "$DTYPE" $CACHE --quiet

# 3b. stream heads on the same samples and target (deterministic: a rerun with the same data and
#     settings keeps the heads it finds)
if [ "$DRAFTERS" != 0 ]; then
  stage "stream heads: $HEADS heads, $STREAM_STEPS steps of $ANCHORS anchors"
  if ! "$PY" - "$WORK/streams/training.json" "$SAMPLES" "$TARGET" "$HEADS" "$STREAM_STEPS" "$ANCHORS" <<'PYEOF'
import json, sys
from pathlib import Path
record = Path(sys.argv[1])
done = json.loads(record.read_text())["settings"] if record.is_file() else {}
data, target, heads, steps, anchors = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
want = {"data": data, "target": target, "heads": heads, "steps": steps, "anchors": anchors}
sys.exit(0 if done and all(done.get(k) == v for k, v in want.items()) else 1)
PYEOF
  then
    "$PCG" draft train --kind streams --data "$SAMPLES" --target "$TARGET" --out "$WORK/streams" \
        --heads "$HEADS" --steps "$STREAM_STEPS" --anchors "$ANCHORS" --device "$DEVICE" --dtype "$DTYPE" --quiet
  fi
fi

# 4. acceptance before/after on held-out texts (per draft position), then the speed benchmarks
stage "draft eval before/after"
"$PCG" draft eval --target "$TARGET" --draft "$WORK/draft-init" --draft "$WORK/draft-kd" \
    --methods exact,pcg --gamma 4 --max-new-tokens "$EVAL_TOKENS" $EVAL_TEXTS --device "$DEVICE" --dtype "$DTYPE" \
    --out "${OUT}_draft_eval.json" --quiet
cp "$WORK/draft-kd/train_log.jsonl" "${OUT}_draft_train_log.jsonl"
if [ "${BENCH:-1}" = 0 ]; then stage "done (BENCH=0: no bench)"; exit 0; fi
stage "bench: batch $BATCHES, gamma $GAMMAS, theta $THETAS"
if [ "$TARGET" = "$WORK/target" ]; then
  MODELS=(--preset llasa-1b-shape)
else
  MODELS=(--target "$TARGET")
fi
"$PCG" bench "${MODELS[@]}" --draft "$WORK/draft-kd" --device "$DEVICE" --dtype "$DTYPE" \
    --draft-weights "$DRAFT_WEIGHTS" \
    --methods ar,exact,pcg --batch-sizes "$BATCHES" --gammas "$GAMMAS" --thetas "$THETAS" \
    --reps "$REPS" --items-per-slot "$ITEMS" --cost-reps "$COST_REPS" --out "${OUT}.json" --quiet
if [ "$DRAFTERS" != 0 ]; then
  # 5. the distilled draft against the heads, side by side in one process (pcg; gammas above
  #    the heads' count run with the draft only)
  stage "drafters: draft model against $HEADS stream heads, batch $BATCHES, gamma $GAMMAS"
  "$PY" benchmarks/bench_drafters.py --target "$TARGET" --draft "$WORK/draft-kd" --streams "$WORK/streams" \
      --device "$DEVICE" --dtype "$DTYPE" --draft-weights "$DRAFT_WEIGHTS" --batch-sizes "$BATCHES" \
      --gammas "$GAMMAS" --reps "$REPS" --items-per-slot "$ITEMS" --out "$DRAFTERS_OUT" --quiet
fi
stage "done: ${OUT}*"
