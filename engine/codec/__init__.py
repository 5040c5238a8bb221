"""Codes <-> audio: `base` (the codec protocol), `load` (a checkpoint of any kind), `xcodec2`
(Llasa's codec), `snac` (Orpheus's), `prompts` (voice prompts), `audio` (clips, WAV/FLAC bytes),
`export` (results -> Parquet/audio files), `cli` (`pcg-synth codec`)."""
