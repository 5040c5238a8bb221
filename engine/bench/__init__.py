"""Benchmarks (`pcg-synth bench`) and the paper's evaluation protocol (`pcg-synth paper-table`)."""
