"""Texts the speed benchmark decodes (the quickstart's, so results stay comparable)."""

BENCH_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose speech tokens.",
    "The large target model verifies them in a single forward pass.",
    "Acoustic similarity groups accept a token that sounds like the right one.",
    "She sells sea shells by the sea shore.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "It was the best of times, it was the worst of times.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
]
