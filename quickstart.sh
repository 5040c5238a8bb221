#!/usr/bin/env bash
# Set up, build the tiny model kit, run the quickstart synthesis job on a local Ray cluster
# (11 manifest rows -> out/quickstart/data/*.parquet with FLAC audio, summary.json), then compare
# the five acceptance rules on the same texts (out/quickstart/methods.json).
# Rerunning is quick: setup is skipped while .venv is up to date, the finished job prints its
# summary, and the comparison prints its saved table (FORCE=1 ./quickstart.sh compares again).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
[ -f kit/kit.json ] || .venv/bin/pcg-synth kit build kit
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
.venv/bin/pcg-synth run jobs/quickstart.yaml
echo
echo "The five acceptance rules on the same texts (tiny kit, this machine):"
if [ -f out/quickstart/methods.json ] && [ "${FORCE:-0}" != 1 ]; then
  echo "(saved by an earlier run in out/quickstart/methods.json; FORCE=1 ./quickstart.sh measures again)"
  .venv/bin/python -c "import json, sys; from engine.cli import summary_table
doc = json.load(open(sys.argv[1]))
print(summary_table([r['summary'] for r in doc['runs']]))
print(doc.get('outlook') or '')" out/quickstart/methods.json
else
  .venv/bin/pcg-synth generate --kit kit --method all --texts-file jobs/quickstart-texts.txt \
    --max-new-tokens 100 --quiet --out out/quickstart/methods.json
fi
echo
echo "Listen to it: .venv/bin/pcg-synth report out/quickstart writes out/quickstart/report.html (players,"
echo "histograms, every row; it opens offline in any browser). What each line above means: docs/getting-started.md."
echo "Next: .venv/bin/pcg-synth --help (or \`source .venv/bin/activate\` and pcg-synth --help); the dataset"
echo "loads with datasets.load_dataset(\"parquet\", data_files=\"out/quickstart/data/*.parquet\") (docs/guides/audio.md)."
