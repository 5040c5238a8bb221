#!/usr/bin/env bash
# The project's packages for a GPU machine that has Python and CUDA torch but none of the rest
# and no registry (a lent machine; see gpu_check.sh's SITE_TAR), as one .tar.xz small enough
# to travel with the repository (about 60 MB: a lent machine's call carries at most 64 MiB).
#
#   bash benchmarks/site_archive.sh            # -> .whl/site.tar.xz (ignored by git)
#   SITE_TAR=.whl/site.tar.xz bash benchmarks/gpu_check.sh     # on the GPU machine
#
# Wheels for the target's Python (PYVER, default 3.12) and x86-64 Linux, without dependencies:
# the list is what the engine, the tests in tests/gpu and the job benchmark import beyond what
# such an image has (torch, numpy, pyarrow, scipy, tqdm, pyyaml, huggingface_hub, tokenizers,
# safetensors, aiohttp, grpcio, ...). Trimmed to fit: Ray's Java jars, RLlib, Serve, LLM and
# dashboard front end, and transformers' model families other than the ones the engine loads
# (llama, xcodec2 and what xcodec2 imports), and botocore's models of AWS services other than S3 and
# the credential ones. faiss-gpu (135 MB) does not fit: faiss-cpu instead.
case "${1:-}" in -h|--help) sed -n "2,$((LINENO - 1))p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
OUT=${OUT:-.whl/site.tar.xz}
PIP=${PIP:-.venv/bin/python -m pip}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# each at the version this checkout's .venv has (scripts/setup.sh installed it): what the tests ran
NAMES=(ray jsonschema jsonschema-specifications referencing rpds-py transformers pydantic pydantic_core
       annotated-types typing-inspection typing_extensions soundfile cffi pycparser boto3 botocore
       s3transfer jmespath faiss-cpu pysbd num2words)
mapfile -t PACKAGES < <(.venv/bin/python - "${NAMES[@]}" <<'PYEOF'
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    print(f"{name}=={version(name)}")
PYEOF
)
$PIP install -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --target "$WORK/site" "${PACKAGES[@]}"
cd "$WORK/site"
rm -rf ray/jars ray/rllib ray/llm ray/serve ray/dashboard/client bin
# botocore's models of every AWS service (gzipped already, ~25 MB): the engine's S3 client needs s3's,
# and credential lookups sts's and sso's
find botocore/data -mindepth 1 -maxdepth 1 -type d ! -name s3 ! -name sts ! -name sso ! -name sso-oidc \
  -exec rm -rf {} +
for d in transformers/models/*/; do
  case "$(basename "$d")" in auto | encoder_decoder | llama | wav2vec2_bert | xcodec2) ;; *) rm -rf "$d" ;; esac
done
find . -name __pycache__ -prune -exec rm -rf {} +
cd - >/dev/null
mkdir -p "$(dirname "$OUT")"
tar -C "$WORK/site" -cf - . | xz -T0 -6 >"$OUT"
echo "$OUT: $(du -h "$OUT" | cut -f1)"
# what a lent machine's call carries: this archive and the tracked files, at most 64 MiB together
TRACKED=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
TOTAL=$(($(stat -c %s "$OUT") + TRACKED))
echo "with the tracked files: $((TOTAL / 1048576)) MiB of the 64 MiB a call carries"
if [ "$TOTAL" -gt $((64 * 1048576)) ]; then
  echo "too large to carry: trim more above" >&2
  exit 1
fi
