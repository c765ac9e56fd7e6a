"""The C++ core's free functions and classes that other layers use, by name.

specnative._core is imported in the engine layer only, so that what the rest of the package asks
of llama.cpp is listed here: the vocabulary-only model (tokenizing prompts without loading
weights), the chat template, the exact acceptance rates, build facts, drafter option checks,
hidden-state drafter pair checks and the RPC backend.
"""
from __future__ import annotations

from specnative import _core

VocabModel = _core.VocabModel  # a model's vocabulary alone: tokenize, detokenize, chat template
chat_apply_template = _core.chat_apply_template
accept_rates = _core.accept_rates  # alpha, token alpha and tau from exact counts, defined once in C++
build_info = _core.build_info
max_parallel_sequences = _core.max_parallel_sequences  # llama.cpp's most sequences per context
candidate_window = float(_core.candidate_window)  # the lossless check's near-tie window (C++ constant)
drafter_of_option = _core.drafter_of_option  # which n-gram drafter an option belongs to
validate_drafter = _core.validate_drafter
check_hidden_pair = _core.check_hidden_pair  # a hidden-state drafter against a target, from headers
supports_rpc = _core.supports_rpc
add_rpc_servers = _core.add_rpc_servers
