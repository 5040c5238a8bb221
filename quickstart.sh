#!/usr/bin/env bash
# Set up, build the tiny model kit, and synthesize speech codes with all five acceptance rules.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
[ -f kit/kit.json ] || .venv/bin/pcg-synth kit build kit
.venv/bin/pcg-synth generate --kit kit --method all --texts-file jobs/quickstart-texts.txt \
  --max-new-tokens 200 --batch-size 8 --out out/quickstart/codes.json
