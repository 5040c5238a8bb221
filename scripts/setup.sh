#!/usr/bin/env bash
# Create .venv with pcg-synth and its test dependencies. Idempotent.
#
# torch: an already-installed torch is kept (GPU users: install the CUDA build you want first,
# or set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
# Otherwise torch==2.13.0 is installed before the project, so the project's `torch>=2.5` range
# pulls nothing else (on the project's CI machines that pin resolves to a local CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q ${TORCH_SPEC:-torch==2.13.0}
fi
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -c "import torch, transformers, engine; print('pcg-synth', engine.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
