"""The stages a row passes in a synthesis worker, one module each, in flow order:

    read.py     ReadStage     a shard -> its manifest rows, validated
    prepare.py  PrepareStage  manifest rows -> row records (settings, seed, voice prompt, provenance,
                              text normalised and planned: a long text's chunks as parts)
    decode.py   DecodeStage   attempts -> speech codes (one continuously batched session)
    codec.py    CodecStage    codes -> audio as it will be written
    verify.py   VerifyStage   audio -> scores; keep, reject, or decode again (the quality gate)
    write.py    WriteStage    a shard's rows -> its files in the output's format (split rows
                              joined, split.py), then the commit record

row.py holds the record they pass (`Row`, its `Attempt`s, the shard's `ShardTask`); the threads
and queues that carry rows from stage to stage are in `runtime/stream.py`, and `runtime/worker.py`
builds the stages. A new stage is a module here with a class taking rows (or attempts) and
returning them, and a line where `runtime/stream.py` runs it.
"""
