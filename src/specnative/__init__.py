"""specnative: measure speculative decoding from inside llama.cpp."""
from specnative.engine import DecodeSpec, Engine, GenerationResult, build_info, quantize

__version__ = "0.1.0"
__all__ = ["DecodeSpec", "Engine", "GenerationResult", "__version__", "build_info", "quantize"]
