"""A model file's GGUF header checked before llama.cpp sees it.

llama.cpp reads a model's hyperparameters from its header and GGML_ASSERTs on some of them while it
loads the model or builds its first graph (src/llama-model.cpp load_hparams, src/models/*.cpp):
an assertion ends the interpreter, so those fields are checked here first, for every architecture
(the general part of load_hparams) and for the hidden-state drafters' own (dflash, eagle3). What
llama.cpp refuses by throwing (a missing key, a key of another type, a tensor whose shape differs
from the header's) is left to it: the Engine turns that into a ValueError already.

Checked, with llama.cpp's own bounds:
- block_count in [1, LLAMA_MAX_LAYERS]; nextn_predict_layers <= block_count;
- the expert counts' consistency (expert_count <= LLAMA_MAX_EXPERTS, experts used, groups);
- head_count (a number or one per layer) and head_count_kv: every layer with heads has kv heads
  that divide them (grouped-query attention broadcasts K and V over the heads: a remainder is
  GGML_ASSERT(ggml_can_mul_mat) in the first graph); attention architectures need heads in every
  layer; without key_length/value_length the head size is embedding_length / head_count, which
  must divide evenly; rope.scaling.type one llama.cpp knows (else an assertion);
- DFlash: block_size >= 2 (the drafter proposes at most block_size - 1 tokens: 0 or 1 never
  drafts), a mask token inside the vocabulary (outside it llama.cpp disables the token and the
  first draft round aborts adding it), target_layers non-negative;
- EAGLE-3: three target_layers (non-negative), target_hidden_size > 0.
Pair checks (a drafter's layers against its target's, widths) are the C++ core's check_hidden_pair.
"""
from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

LLAMA_MAX_LAYERS = 512    # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama_rope_scaling_type_from_string
# Architectures whose every layer is attention (a head count of 0 there is a damaged header, not
# a recurrent layer): the ones this project runs, its drafters and their usual targets.
ATTENTION_ARCHS = frozenset({"llama", "dflash", "eagle3", "gemma", "gemma2", "gemma3", "qwen2", "qwen3", "qwen3moe",
                             "mistral3", "phi3", "deci", "granite", "nanbeige", "smollm3"})
# Architectures where llama.cpp drops a single expert (n_expert <= 1 means a dense model)
SINGLE_EXPERT_IS_DENSE = frozenset({"hunyuan-dense", "hunyuan_vl"})
# The hidden-state drafter files' architectures (what llama.cpp infers the drafter kind from)
DRAFTER_ARCHS = {"dflash": "DFlash", "eagle3": "EAGLE-3"}


# struct formats of the header's scalar value types (gguf.GGUFValueType)
_SCALARS = {"UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i", "FLOAT32": "f",
            "BOOL": "?", "UINT64": "Q", "INT64": "q", "FLOAT64": "d"}
# Numeric arrays up to this length are kept (per-layer counts, target layers); longer ones (token
# scores and types) only counted
_KEEP_ARRAY = 4096


class Header:
    """The key/value section of a GGUF header, read with the gguf package's magic and value types.
    gguf.GGUFReader builds an object per string of the vocabulary (34 s for a 262k-token vocabulary
    on a 2-core host), so this reader skips array contents it does not need: a string array is
    kept as its length only, numeric arrays longer than _KEEP_ARRAY likewise. No tensor data is
    read. A file that is not a GGUF, or is cut short inside its header, is a ValueError."""

    def __init__(self, path):
        import mmap

        import gguf

        self.path = Path(path)
        self.fields: dict = {}
        self.lengths: dict = {}  # array key -> its length (string and long arrays: the length only)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            self._data, self._at = data, 0
            try:
                if self._unpack("<I") != gguf.GGUF_MAGIC:
                    raise ValueError("not a GGUF file (bad magic)")
                version = self._unpack("<I")
                self._order = "<" if version & 0xFFFF else ">"  # a big-endian file reads as a huge version
                self._unpack(self._order + "Q")  # tensor count
                n_kv = self._unpack(self._order + "Q")
                types = {t.value: t.name for t in gguf.GGUFValueType}
                for _ in range(n_kv):
                    key = self._string()
                    kind = types.get(self._unpack(self._order + "I"))
                    self.fields[key] = self._value(kind, types, key)
            except struct.error:
                raise ValueError("the header is cut short") from None
            finally:
                self._data = None
        arch = self.fields.get("general.architecture")
        self.arch = arch if isinstance(arch, str) else ""

    def _unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self._data, self._at)[0]
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack(self._order + "Q")
        if n > len(self._data) - self._at:
            raise ValueError("a string runs past the end of the file")
        text = bytes(self._data[self._at:self._at + n]).decode("utf-8", errors="replace")
        self._at += n
        return text

    def _value(self, kind, types: dict, key: str):
        if kind in _SCALARS:
            return self._unpack(self._order + _SCALARS[kind])
        if kind == "STRING":
            return self._string()
        if kind != "ARRAY":
            raise ValueError(f"{key} has an unknown value type")
        item = types.get(self._unpack(self._order + "I"))
        n = self._unpack(self._order + "Q")
        if n > len(self._data):
            raise ValueError(f"{key} claims {n} entries")
        self.lengths[key] = n
        if item in _SCALARS and n <= _KEEP_ARRAY:
            fmt = self._order + f"{n}{_SCALARS[item]}"
            values = list(struct.unpack_from(fmt, self._data, self._at))
            self._at += struct.calcsize(fmt)
            return values
        if item in _SCALARS:
            self._at += n * struct.calcsize(_SCALARS[item])
            if self._at > len(self._data):
                raise ValueError(f"{key} runs past the end of the file")
            return None
        for _ in range(n):  # strings (the vocabulary) or nested arrays: skipped, counted
            if item == "STRING":
                length = self._unpack(self._order + "Q")
                self._at += length
            else:
                self._value(item, types, key)
        if self._at > len(self._data):
            raise ValueError(f"{key} runs past the end of the file")
        return None

    def get(self, key: str):
        """The field's value (int, float, str, bool, or a list of numbers), None when absent or an
        array that was only counted."""
        return self.fields.get(key)

    def integer(self, key: str):
        """An integer field's value; None when absent or not an integer (llama.cpp refuses a key of
        another type itself, with an error rather than an assertion)."""
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def per_layer(self, key: str, n_layer: int):
        """A field llama.cpp reads with get_key_or_arr: one number for all layers or one per layer;
        None when absent or not integers."""
        value = self.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return [value] * n_layer
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        return None

    def n_vocab(self):
        """Tokens in the vocabulary: the tokenizer's list, else {arch}.vocab_size."""
        if "tokenizer.ggml.tokens" in self.lengths:
            return self.lengths["tokenizer.ggml.tokens"]
        return self.integer(f"{self.arch}.vocab_size")


def read_header(path) -> Header:
    """The header of `path`, read once per file content (path, size and modification time)."""
    stat = os.stat(path)
    return _read_header(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_header(path: str, size: int, mtime_ns: int) -> Header:
    return Header(path)


def architecture(path) -> str:
    """general.architecture of a GGUF file ("" when the header cannot be read or has none)."""
    try:
        return read_header(path).arch
    except (OSError, ValueError):
        return ""


def header_problems(path) -> list[str]:
    """What in the header of `path` llama.cpp would abort on, one item per field; [] for a sound
    header, and for a file gguf-py cannot read at all (llama.cpp's loader refuses that itself)."""
    try:
        header = read_header(path)
    except (OSError, ValueError):  # not a GGUF, or cut short: llama.cpp's loader says what is wrong
        return []
    if not header.arch:
        return []
    return _general_problems(header) + _drafter_problems(header)


def _general_problems(h: Header) -> list[str]:
    arch, problems = h.arch, []
    n_layer = h.integer(f"{arch}.block_count")
    if n_layer is None:
        return problems  # absent or mistyped: llama.cpp refuses the key with an error
    if not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        return [f"{arch}.block_count is {n_layer}; llama.cpp needs 1 to {LLAMA_MAX_LAYERS} layers"]
    nextn = h.integer(f"{arch}.nextn_predict_layers")
    if nextn is not None and nextn > n_layer:
        problems.append(f"{arch}.nextn_predict_layers {nextn} exceeds {arch}.block_count {n_layer}")
    problems += _expert_problems(h, n_layer)
    scaling = h.get(f"{arch}.rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
        problems.append(f"{arch}.rope.scaling.type is {scaling!r}; llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}")
    n_embd = h.integer(f"{arch}.embedding_length")
    if n_embd is not None and n_embd < 1:
        problems.append(f"{arch}.embedding_length is {n_embd}; it must be at least 1")
    heads = h.per_layer(f"{arch}.attention.head_count", n_layer)
    if heads is None:
        return problems
    kv_heads = h.per_layer(f"{arch}.attention.head_count_kv", n_layer) or heads
    for key, values in ((f"{arch}.attention.head_count", heads), (f"{arch}.attention.head_count_kv", kv_heads)):
        if len(values) != n_layer:
            return problems + [f"{key} has {len(values)} entries for {n_layer} layers ({arch}.block_count)"]
    for il, (n_head, n_head_kv) in enumerate(zip(heads, kv_heads)):
        where = f" (layer {il})" if len(set(heads)) > 1 or len(set(kv_heads)) > 1 else ""
        if n_head < 0 or n_head_kv < 0 or (n_head == 0 and arch in ATTENTION_ARCHS):
            problems.append(f"{arch}.attention.head_count is {n_head}{where}; an attention layer needs heads")
            break
        if n_head > 0 and (n_head_kv == 0 or n_head % n_head_kv):
            problems.append(f"{arch}.attention.head_count_kv {n_head_kv} does not divide {arch}.attention.head_count "
                            f"{n_head}{where} (grouped-query attention shares each K/V head among a whole number "
                            f"of heads)")
            break
    n_head0 = heads[0]
    if n_head0 > 0 and n_embd:
        for what in ("key", "value"):
            length = h.integer(f"{arch}.attention.{what}_length")
            if length is not None and length < 1:
                problems.append(f"{arch}.attention.{what}_length is {length}; a head needs at least 1 dimension")
            elif length is None and n_embd % n_head0:
                problems.append(f"{arch}.embedding_length {n_embd} is not a multiple of {arch}.attention.head_count "
                                f"{n_head0}, and no {arch}.attention.{what}_length gives the head size")
                break
    return problems


def _expert_problems(h: Header, n_layer: int) -> list[str]:
    arch = h.arch
    n_expert = h.integer(f"{arch}.expert_count") or 0
    used = h.per_layer(f"{arch}.expert_used_count", n_layer) or [0]
    used_max = max(used)
    groups = h.integer(f"{arch}.expert_group_count") or 0
    group_used = h.integer(f"{arch}.expert_group_used_count") or 0
    if arch in SINGLE_EXPERT_IS_DENSE and n_expert <= 1:
        n_expert, used_max = 0, 0
    key = f"{arch}.expert_count"
    if not 0 <= n_expert <= LLAMA_MAX_EXPERTS:
        return [f"{key} is {n_expert}; llama.cpp allows 0 to {LLAMA_MAX_EXPERTS}"]
    if used_max > n_expert:
        return [f"{arch}.expert_used_count {used_max} exceeds {key} {n_expert}"]
    if n_expert > 0:
        if used_max < 1:
            return [f"{key} is {n_expert} but {arch}.expert_used_count is {used_max}: no expert would run"]
        if groups >= n_expert:
            return [f"{arch}.expert_group_count {groups} must be below {key} {n_expert}"]
        if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            return [(f"{arch}.expert_group_count {groups} must divide {key} {n_expert}, with "
                     f"{arch}.expert_group_used_count ({group_used}) between 1 and {groups - 1}")]
    elif used_max or groups:
        return [f"{key} is 0 but {arch}.expert_used_count or {arch}.expert_group_count is set"]
    return []


def _drafter_problems(h: Header) -> list[str]:
    arch, problems = h.arch, []
    if arch not in DRAFTER_ARCHS:
        return problems
    layers = h.get(f"{arch}.target_layers")
    if isinstance(layers, list) and any(not isinstance(v, int) or v < 0 for v in layers):
        problems.append(f"{arch}.target_layers {layers} holds a negative layer")
    if arch == "eagle3":
        if isinstance(layers, list) and len(layers) != 3:
            problems.append(f"eagle3.target_layers has {len(layers)} entries; EAGLE-3 reads exactly 3 target layers")
        hidden = h.integer("eagle3.target_hidden_size")
        if hidden is not None and hidden < 1:
            problems.append(f"eagle3.target_hidden_size is {hidden}; it must be the target's embedding_length")
        return problems
    if isinstance(layers, list) and not layers:
        problems.append("dflash.target_layers is empty; a DFlash drafter reads at least one target layer")
    block = h.get("dflash.block_size")
    if isinstance(block, int) and not isinstance(block, bool) and block < 2:
        problems.append(f"dflash.block_size is {block}; a DFlash drafter proposes at most block_size - 1 tokens a "
                        f"round, so it needs at least 2")
    mask = h.get("tokenizer.ggml.mask_token_id")
    n_vocab = h.n_vocab()
    if isinstance(mask, int) and n_vocab is not None and not 0 <= mask < n_vocab:
        problems.append(f"tokenizer.ggml.mask_token_id {mask} lies outside the vocabulary of {n_vocab} tokens; "
                        f"a DFlash drafter feeds that token in every draft block")
    return problems


def drafter_kind(path) -> str:
    """What llama.cpp takes a drafter file for: dflash, dflash2, dspark or eagle3 ("" for any other
    model), the core's own inference from the header (its tensors tell DFlash2 and DSpark apart);
    from the architecture alone where the core does not say."""
    from specnative import _core

    infer = getattr(_core, "hidden_drafter_file_kind", None)
    if infer is not None:
        return infer(str(path))
    return {"dflash": "dflash", "eagle3": "eagle3"}.get(architecture(path), "")


def role_of(path, role: str) -> str:
    """`role` ("draft") as the message says it: a hidden-state drafter's file is "drafter"."""
    return "drafter" if role == "draft" and architecture(path) in DRAFTER_ARCHS else role


def check_model_file(path, role: str) -> None:
    """ValueError naming the file and the field when llama.cpp would abort on its header."""
    problems = header_problems(path)
    if problems:
        raise ValueError(f"{role_of(path, role)} model {path}: " + "; ".join(problems))
