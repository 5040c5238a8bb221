#!/usr/bin/env bash
# The GPU benchmark of issues 6 and 7 as one script: the llasa-1b-shape target (Llasa-1B
# dimensions, random weights), a 3-layer draft distilled against it for a few minutes, draft
# acceptance before/after, then `pcg-synth bench` with the distilled draft. Results land in
# benchmarks/results/ (commit them). Needs one CUDA GPU (not yet run on one: duration unknown).
#
#   bash benchmarks/gpu_llasa_1b_shape.sh
#
# Overrides (environment): WORK (scratch dir), DEVICE, STEPS, SEEDS (target samples per text),
# TARGET (an existing target directory instead of the preset: e.g. a tiny kit's target/ with
# DEVICE=cpu to check the chain on a CPU), LAYERS, BATCHES, OUT (result-file stem).
set -euo pipefail
cd "$(dirname "$0")/.."
PCG=${PCG:-.venv/bin/pcg-synth}
PY=${PY:-.venv/bin/python}
WORK=${WORK:-work/llasa-1b-shape}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-1500}
SEEDS=${SEEDS:-16}
LAYERS=${LAYERS:-0,1,15}
BATCHES=${BATCHES:-1,2,4,8,16,32,64}
OUT=${OUT:-benchmarks/results/llasa_1b_shape_$(echo "$DEVICE" | tr -d ':')}
mkdir -p "$WORK" "$(dirname "$OUT")"

if [ -z "${TARGET:-}" ]; then
  # 1. the preset's target on disk (deterministic: seed 0), with its untrained 3-layer draft
  #    measured once as the "before" bench
  "$PCG" bench --preset llasa-1b-shape --device "$DEVICE" --save-preset "$WORK" \
      --batch-sizes 1 --methods ar,exact,pcg --reps 3 --out "${OUT}_untrained_draft.json" --quiet
  TARGET=$WORK/target
fi

# 2. target samples: every training text under SEEDS seeds (`ar`, temperature 0.8)
"$PY" - "$WORK/texts.jsonl" "$SEEDS" <<'EOF'
import json, sys
from engine.kit.draft import KIT_TRAIN_TEXTS
with open(sys.argv[1], "w") as f:
    for seed in range(int(sys.argv[2])):
        for i, text in enumerate(KIT_TRAIN_TEXTS):
            f.write(json.dumps({"id": f"t{i}-s{seed}", "text": text, "seed": 1000 + seed}) + "\n")
EOF
"$PCG" generate --target "$TARGET" --texts-file "$WORK/texts.jsonl" --method ar --temperature 0.8 \
    --max-new-tokens 256 --batch-size 64 --device "$DEVICE" --out "$WORK/samples.json" --quiet

# 3. the draft: a layer subset, then knowledge distillation (rerunning resumes)
"$PCG" draft init --target "$TARGET" --layers "$LAYERS" --out "$WORK/draft-init" --force --quiet
"$PCG" draft train --data "$WORK/samples.json" --draft "$WORK/draft-init" --target "$TARGET" \
    --out "$WORK/draft-kd" --steps "$STEPS" --batch-size 16 --lr 1e-3 --eval-every 250 \
    --checkpoint-every 500 --device "$DEVICE" --quiet

# 4. acceptance before/after on held-out texts, and the speed benchmark with the trained draft
"$PCG" draft eval --target "$TARGET" --draft "$WORK/draft-init" --draft "$WORK/draft-kd" \
    --device "$DEVICE" --out "${OUT}_draft_eval.json" --quiet
cp "$WORK/draft-kd/train_log.jsonl" "${OUT}_draft_train_log.jsonl"
if [ "$TARGET" = "$WORK/target" ]; then
  "$PCG" bench --preset llasa-1b-shape --draft "$WORK/draft-kd" --device "$DEVICE" \
      --batch-sizes "$BATCHES" --gammas 2,3,4 --thetas 0.3,0.4,0.5 --reps 3 --out "${OUT}.json" --quiet
else
  "$PCG" bench --target "$TARGET" --draft "$WORK/draft-kd" --device "$DEVICE" \
      --batch-sizes "$BATCHES" --reps 3 --out "${OUT}.json" --quiet
fi
echo "results: ${OUT}*"
