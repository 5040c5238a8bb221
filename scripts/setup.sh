#!/usr/bin/env bash
# Create .venv with pcg-synth, its test dependencies and what `datasets` needs to decode the audio
# the engine writes. Idempotent, and quick when nothing changed: a stamp in .venv records what the
# last complete run installed (a hash of pyproject.toml, this script, TORCH_SPEC and the Python);
# PCG_SYNTH_REINSTALL=1 installs again anyway.
#
# torch (installed before the project, so nothing later can pick another build):
#   - an already-installed torch is kept (one older than pyproject.toml's floor stops setup with what to do);
#   - TORCH_SPEC, when set, is installed as given, e.g.
#     TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128";
#   - on a machine with an NVIDIA GPU (`nvidia-smi -L` works or /proc/driver/nvidia exists):
#     torch==2.13.0 from PyPI, its default CUDA build;
#   - otherwise the CPU build torch==2.13.0+cpu: from the configured package indexes when they
#     have it, else from the PyTorch CPU index (https://download.pytorch.org/whl/cpu).
#   The torch installed is then pinned (a pip constraint) while the project installs.
#   PCG_SYNTH_GPU=1 or 0 overrides the GPU detection.
# faiss: the [gpu] extra (faiss-gpu) on GPU machines, the [cpu] extra (faiss-cpu) otherwise.
# FFmpeg: `datasets` decodes audio with torchcodec, which loads FFmpeg's shared libraries. When
#   they are missing and this runs as root on a Debian/Ubuntu machine, apt-get installs them
#   (PCG_SYNTH_APT=0 skips that); otherwise it says how to get them.
# espeak-ng and Chromium (the quality gate's and the headless-browser tests') are installed the
#   same way where missing; without them those tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_FLOOR=$(sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)  # the oldest torch the suite runs on
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ -n "${PCG_SYNTH_GPU:-}" ]; then
  GPU=$PCG_SYNTH_GPU
elif { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || [ -e /proc/driver/nvidia ]; then
  GPU=1
else
  GPU=0
fi
if [ "$GPU" = 1 ]; then EXTRAS=test,gpu; else EXTRAS=test,cpu; fi

stamp_of() {
  { cat pyproject.toml scripts/setup.sh; echo "${TORCH_SPEC:-} $EXTRAS"; "$PYTHON" --version 2>&1; } | sha256sum | cut -c1-16
}
STAMP=.venv/.pcg-synth-setup
want=$(stamp_of)
if [ "${PCG_SYNTH_REINSTALL:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
   && [ -x .venv/bin/pcg-synth ]; then
  echo "setup: .venv is up to date (PCG_SYNTH_REINSTALL=1 bash scripts/setup.sh installs again)"
  exit 0
fi

# An older torch than pyproject.toml's floor in .venv stops setup with what to do (not with pip's
# resolver conflict when the project installs against it).
check_torch_floor() {
  .venv/bin/python -W ignore - "$TORCH_FLOOR" <<'PYEOF' || exit 1  # (torch warns: numpy not yet installed)
import sys
import torch
have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
need = tuple(int(p) for p in sys.argv[1].split("."))
if have < need:
    print(f"setup: .venv has torch {torch.__version__}; pcg-synth needs torch >= {sys.argv[1]}. Upgrade it "
          f"(.venv/bin/python -m pip install 'torch>={sys.argv[1]}' with the index of your build) or remove .venv, "
          "then run this again.", file=sys.stderr)
    sys.exit(1)
PYEOF
}

pip() { .venv/bin/python -m pip "$@"; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if .venv/bin/python -c "import torch" 2>/dev/null; then check_torch_floor; fi  # before any download
rm -f "$STAMP"
pip install -q --upgrade pip

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    # shellcheck disable=SC2086
    pip install -q $TORCH_SPEC
  elif [ "$GPU" = 1 ]; then
    echo "setup: NVIDIA GPU found: torch==$TORCH_VERSION from PyPI (CUDA build)"
    pip install -q "torch==$TORCH_VERSION"
  else
    echo "setup: no NVIDIA GPU: the CPU build torch==$TORCH_VERSION+cpu"
    log=$(mktemp)
    if ! pip install -q "torch==$TORCH_VERSION+cpu" >"$log" 2>&1; then
      echo "setup: not on the configured indexes; trying $CPU_INDEX"
      pip install -q "torch==$TORCH_VERSION+cpu" --index-url "$CPU_INDEX" --extra-index-url https://pypi.org/simple \
        || { cat "$log"; rm -f "$log"; exit 1; }
    fi
    rm -f "$log"
  fi
fi
check_torch_floor
# Keep exactly this torch while the project and its extras install (resemblyzer, for one, asks
# for a bare `torch`, which must not bring in another build).
.venv/bin/python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > .venv/torch-constraint.txt
pip install -q -c .venv/torch-constraint.txt -e ".[$EXTRAS]"

# System packages: installed with apt-get where this runs as root on Debian/Ubuntu (PCG_SYNTH_APT=0
# skips it); apt_install PACKAGE WHY: quiet, refreshing the package lists once if the first try fails.
can_apt() { [ "${PCG_SYNTH_APT:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_install() {
  echo "setup: installing $1 with apt-get ($2; PCG_SYNTH_APT=0 skips this)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "$1" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends "$1" >/dev/null 2>&1; }
}

# FFmpeg's shared libraries for torchcodec (datasets' audio decoding).
decodes() { .venv/bin/python -c "from torchcodec.decoders import AudioDecoder" >/dev/null 2>&1; }
if ! decodes; then
  if can_apt; then apt_install ffmpeg "datasets decodes audio through its shared libraries" || true; fi
  if ! decodes; then
    echo "setup: note: datasets cannot decode the audio column until FFmpeg's shared libraries are installed" \
         "(sudo apt-get install ffmpeg, or conda install ffmpeg); until then read the audio bytes with" \
         "Audio(decode=False) and soundfile (README, Audio output). Everything else works."
  fi
fi

# espeak-ng: the quality gate's tests (tests/cpu/test_quality_gate.py) tell real speech from the
# tiny kit's noise with clips it speaks; without it those tests skip.
if ! command -v espeak-ng >/dev/null 2>&1 && can_apt; then
  apt_install espeak-ng "the quality gate's tests speak with it" \
    || echo "setup: note: espeak-ng could not be installed: the quality gate's speech test will skip"
fi

# Chromium: the headless-browser tests (tests/cpu/browser.py: the report, the documentation site)
# drive Debian's chromium through Playwright, never Playwright's own browser download; without it
# those tests skip.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 && can_apt; then
  apt_install chromium "the browser tests open pages in it" \
    || echo "setup: note: chromium could not be installed: the headless-browser tests will skip"
fi

.venv/bin/python -c "import torch, transformers, engine; print('pcg-synth', engine.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
echo "$want" > "$STAMP"
echo "setup: done. Run the CLI as .venv/bin/pcg-synth, or \`source .venv/bin/activate\` and then \`pcg-synth --help\`."
