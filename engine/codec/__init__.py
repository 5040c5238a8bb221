"""X-codec2 codes <-> 16 kHz audio: `xcodec2` (codec), `prompts` (voice prompts), `audio`
(clips, WAV/FLAC bytes), `export` (results -> Parquet/audio files), `cli` (`pcg-synth codec`)."""
