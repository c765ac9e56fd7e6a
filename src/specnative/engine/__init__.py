"""The engine layer: the only part of specnative that imports the C++ core (specnative._core).

Engine loads a target (and a draft or a hidden-state drafter) and generates for N concurrent
sequences with or without speculation under a DecodeSpec (decode_spec.py), returning exact counts
and step timers; native.py names
the core's free functions other layers use.
"""
from specnative.engine.decode_spec import ACCEPT_RULES, DecodeSpec, synthetic_probabilities
from specnative.engine.drafters import (
                                        DRAFTERS,
                                        HIDDEN_DRAFTERS,
                                        check_draft_p_min,
                                        checked_drafter_options,
                                        drafter_defaults,
                                        drafter_name,
                                        drafter_options_problem,
                                        drafter_options_text,
)
from specnative.engine.draft_shape import TREE_DRAFTERS, DraftShape
from specnative.engine.draft_shape import parse as parse_draft_shape
from specnative.engine.draft_shape import parse_list as parse_draft_shapes
from specnative.engine.spec_policy import SpecPolicy
from specnative.engine.spec_policy import parse as parse_spec_policy
from specnative.engine.engine import (
                                        DECODING_STEPS,
                                        SPLIT_MODES,
                                        Engine,
                                        GenerationResult,
                                        build_info,
                                        decoding_ms,
                                        default_threads,
                                        engine_own_time,
                                        placement_args,
                                        quantize,
                                        rpc_device_names,
)

__all__ = ["DRAFTERS", "HIDDEN_DRAFTERS", "check_draft_p_min", "checked_drafter_options", "drafter_defaults",
           "drafter_name", "drafter_options_problem", "drafter_options_text", "ACCEPT_RULES", "DECODING_STEPS",
           "SPLIT_MODES", "DecodeSpec", "Engine", "GenerationResult", "build_info", "decoding_ms", "default_threads",
           "engine_own_time", "placement_args", "quantize", "rpc_device_names", "synthetic_probabilities", "DraftShape",
           "parse_draft_shape", "parse_draft_shapes", "TREE_DRAFTERS", "SpecPolicy", "parse_spec_policy"]
