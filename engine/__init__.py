"""pcg-synth: batch speech synthesis with speculative decoding and PCG acceptance."""

from engine.api import RunSummary, SynthesisItem, SynthesisResult, Synthesizer
from engine.config import DecodingSettings

__all__ = ["DecodingSettings", "RunSummary", "SynthesisItem", "SynthesisResult", "Synthesizer"]
__version__ = "0.1.0"
