"""llama-bench's row: its fields in its order and their types, as tools/llama-bench/llama-bench.cpp
(test::get_fields, test::get_field_type) has them at the pinned llama.cpp commit; the values it
gives where the engine has no such setting; and the draft columns that speculative rows add after
them."""
from __future__ import annotations

import re
from pathlib import Path

# test::get_fields() at the pinned commit, in its order (tests/llama_bench_fields.txt is the same
# list, recorded; the tests compare both with the vendored source where it is present)
LLAMA_BENCH_FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends",
    "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
    "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode",
    "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode",
    "embeddings",
    "no_op_offload", "no_host", "repack", "fit_target", "fit_min_ctx",
    "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)
# the json/jsonl printers add these two lists after the fields
SAMPLE_FIELDS = ("samples_ns", "samples_ts")

INT_FIELDS = frozenset({
    "build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params", "n_gpu_layers",
    "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe",
    "fit_target", "fit_min_ctx", "flash_attn"})
BOOL_FIELDS = frozenset({"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"})
FLOAT_FIELDS = frozenset({"avg_ts", "stddev_ts"})


def field_type(name: str) -> str:
    """llama-bench's type of a field: INT, BOOL, FLOAT or STRING (its json and sql printers use it)."""
    if name in INT_FIELDS:
        return "INT"
    if name in BOOL_FIELDS:
        return "BOOL"
    if name in FLOAT_FIELDS:
        return "FLOAT"
    return "STRING"


# llama-bench's values for the settings the engine has no flag for (cmd_params_defaults, printed
# as test::get_values prints them); build_number: llama.cpp's build number is not recorded in our
# build, so llama-bench's value for a build outside git
FIXED_VALUES = {
    "build_number": 0, "cpu_mask": "0x0", "cpu_strict": 0, "poll": 50, "type_k": "f16", "type_v": "f16",
    "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": 0, "devices": "auto",
    "tensor_split": "0.00", "tensor_buft_overrides": "none", "load_mode": "auto", "lazy_mode": "auto",
    "embeddings": 0, "no_op_offload": 0, "no_host": 0, "repack": 1, "fit_target": 0, "fit_min_ctx": 0,
    "n_depth": 0,
}

# the columns a speculative row adds after llama-bench's (and their types in csv, json and sql)
DRAFT_FIELDS = (
    "spec_type", "draft_model_filename", "n_draft", "n_drafted", "n_accepted", "accept_rate",
    "mean_accept_len", "speedup", "speedup_low", "speedup_high", "lossless",
)
DRAFT_TYPES = {
    "spec_type": "STRING", "draft_model_filename": "STRING", "n_draft": "INT", "n_drafted": "INT",
    "n_accepted": "INT", "accept_rate": "FLOAT", "mean_accept_len": "FLOAT", "speedup": "FLOAT",
    "speedup_low": "FLOAT", "speedup_high": "FLOAT", "lossless": "STRING",
}


def any_type(name: str) -> str:
    return DRAFT_TYPES.get(name) or field_type(name)


def vendored_source(root: Path) -> Path:
    return Path(root) / "vendor" / "llama.cpp" / "tools" / "llama-bench" / "llama-bench.cpp"


def fields_in_source(text: str) -> list[str]:
    """The field list of test::get_fields() in llama-bench.cpp's text, in order."""
    match = re.search(r"get_fields\(\)\s*\{.*?fields\s*=\s*\{(.*?)\};", text, re.DOTALL)
    if match is None:
        raise ValueError("llama-bench.cpp: no test::get_fields() field list found")
    return re.findall(r'"([a-z0-9_]+)"', match.group(1))
