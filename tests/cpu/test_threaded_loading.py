"""Models and a codec loaded on two threads at once in a fresh process (a service starting up):
transformers' first import on one thread must not fail the other's (`engine/hf.py`)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, threading
from engine import Synthesizer
from engine.codec.xcodec2 import Xcodec2Codec
assert "transformers" not in sys.modules  # the race needs transformers' first import
kit, loaded, errors = sys.argv[1], {}, []

def run(name, load):
    try:
        loaded[name] = load()
    except Exception as exc:
        errors.append(f"{name}: {exc!r}")

threads = [threading.Thread(target=run, args=("synth", lambda: Synthesizer.load(
               kit + "/target", draft=kit + "/draft", device="cpu", dtype="float32", batch_size=1))),
           threading.Thread(target=run, args=("codec", lambda: Xcodec2Codec.load(kit + "/codec", device="cpu")))]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert loaded["synth"].target.layout.num_codes == 65536 and loaded["codec"].sample_rate == 16000
print("ok")
"""


def test_a_synthesizer_and_a_codec_load_on_two_threads_at_once(kit_dir):
    done = subprocess.run([sys.executable, "-c", CODE, str(kit_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-2000:] + done.stderr[-3000:]
