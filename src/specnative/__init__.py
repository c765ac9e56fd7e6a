"""specnative: measure speculative decoding from inside llama.cpp."""
from specnative.engine import Engine, GenerationResult, build_info, quantize

__version__ = "0.1.0"
__all__ = ["Engine", "GenerationResult", "build_info", "quantize", "__version__"]
