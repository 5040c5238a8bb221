#!/usr/bin/env bash
# Set up, build the tiny model kit, run the quickstart synthesis job on a local Ray cluster
# (11 manifest rows -> out/quickstart/data/*.parquet with FLAC audio, summary.json), then compare
# the five acceptance rules on the same texts (out/quickstart/methods.json).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
[ -f kit/kit.json ] || .venv/bin/pcg-synth kit build kit
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
.venv/bin/pcg-synth run jobs/quickstart.yaml
echo
echo "The five acceptance rules on the same texts (tiny kit, this machine):"
.venv/bin/pcg-synth generate --kit kit --method all --texts-file jobs/quickstart-texts.txt \
  --max-new-tokens 100 --quiet --out out/quickstart/methods.json
