"""The shape of a model as a cost model needs it: the bytes of every weight matrix by type, and the
dimensions that set the attention and KV-cache costs.

From a GGUF file (`from_gguf`: each tensor's exact bytes and type as stored) or, for a model you do
not have, from an HF-style config.json and a weight type (`from_config`: bytes from the type's block
size). The weights are grouped by role: `layer` (the matrices of the repeating blocks: one matrix
product per token), `output` (the LM head: one matrix product per token that asks for logits),
`embedding` (rows looked up, not multiplied) and `other` (norms and biases: read, not multiplied).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

KV_BYTES_PER_ELEMENT = 2.0  # llama.cpp's default KV cache type is F16


class ShapeError(ValueError):
    """A model file or config this module cannot read as a transformer shape."""


@dataclass(frozen=True)
class Weights:
    """All matrices of one role and one storage type: elements, bytes and rows (a matrix product does
    one dot product per weight row and activation row)."""
    role: str
    type_name: str
    n_elements: int
    n_bytes: int
    n_rows: int = 0
    # the greatest common divisor of the matrices' row lengths (elements per weight row): what a
    # backend's alignment rules test (Metal's small-batch kernels need a multiple of 128); 0: unknown
    row_length: int = 0


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    weights: tuple = field(default_factory=tuple)  # Weights, by role and type

    def bytes_of(self, role: str) -> int:
        return sum(w.n_bytes for w in self.weights if w.role == role)

    def elements_of(self, role: str) -> int:
        return sum(w.n_elements for w in self.weights if w.role == role)

    @property
    def total_bytes(self) -> int:
        return sum(w.n_bytes for w in self.weights)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one position occupies, all layers (K and V, F16)."""
        return self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * KV_BYTES_PER_ELEMENT

    def describe(self) -> str:
        return (f"{self.name}: {self.arch}, {self.n_layer} layers, width {self.n_embd}, {self.n_head} heads "
                f"({self.n_head_kv} KV), vocabulary {self.n_vocab}, {self.total_bytes / 2**20:.1f} MiB of weights")


def type_size(type_name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGML type, from the gguf package's table."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        raise ShapeError(f"unknown weight type {type_name!r}: use a GGML type such as F16, Q8_0, Q4_0, Q4_K") from None


def _role(name: str, n_dims: int, has_output: bool) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "embedding" if has_output else "output"  # tied embeddings: the LM head reads it
    if name.startswith("blk.") and name.endswith(".weight") and n_dims >= 2:
        return "layer"
    return "other"


def _group(rows) -> tuple:
    sums: dict = {}
    for role, type_name, n_el, n_b, n_rows in rows:
        e, b, n, g = sums.get((role, type_name), (0, 0, 0, 0))
        sums[(role, type_name)] = (e + n_el, b + n_b, n + n_rows, math.gcd(g, n_el // n_rows if n_rows else 0))
    return tuple(Weights(r, t, e, b, n, g) for (r, t), (e, b, n, g) in sorted(sums.items()))


def from_gguf(path) -> ModelShape:
    """The shape of a GGUF model file (exact bytes per tensor as stored)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ShapeError(f"no such model file: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # a damaged or foreign file: one line
        raise ShapeError(f"{path.name} is not a readable GGUF file: {error}") from None

    def field_value(key, default=None):
        f = reader.fields.get(key)
        if f is None or not f.data:
            return default
        value = f.parts[f.data[0]]
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(value).decode("utf-8", "replace")
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
            return len(f.data)
        return value.tolist()[0] if hasattr(value, "tolist") else value

    arch = field_value("general.architecture")
    if not arch:
        raise ShapeError(f"{path.name} has no general.architecture")
    n_layer = field_value(f"{arch}.block_count")
    n_embd = field_value(f"{arch}.embedding_length")
    n_head = field_value(f"{arch}.attention.head_count")
    if not (n_layer and n_embd and n_head):
        raise ShapeError(f"{path.name}: {arch}.block_count, embedding_length or attention.head_count missing")
    n_head_kv = field_value(f"{arch}.attention.head_count_kv", n_head)
    head_k = field_value(f"{arch}.attention.key_length", n_embd // n_head)
    head_v = field_value(f"{arch}.attention.value_length", head_k)
    names = {t.name for t in reader.tensors}
    has_output = "output.weight" in names
    rows, n_vocab = [], field_value("tokenizer.ggml.tokens", 0)
    for t in reader.tensors:
        role = _role(t.name, len(t.shape), has_output)
        if role == "output":
            n_vocab = n_vocab or int(max(t.shape))
        inner = int(t.shape[0]) if len(t.shape) >= 2 else int(t.n_elements)  # ne0: the length of one row
        rows.append((role, t.tensor_type.name, int(t.n_elements), int(t.n_bytes), int(t.n_elements) // max(inner, 1)))
    return ModelShape(path.name, arch, int(n_layer), int(n_embd), int(n_head), int(n_head_kv), int(head_k),
                      int(head_v), int(n_vocab), _group(rows))


# A file type's names for its mix; the layers take the first type, the LM head the second.
MIXES = {"Q4_0": ("Q4_0", "Q6_K"), "Q4_1": ("Q4_1", "Q6_K"), "Q5_0": ("Q5_0", "Q6_K"), "Q5_1": ("Q5_1", "Q6_K"),
         "Q4_K_M": ("Q4_K", "Q6_K"), "Q4_K_S": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K"),
         "Q3_K_M": ("Q3_K", "Q6_K"), "Q2_K": ("Q2_K", "Q6_K")}


def from_config(path, weight_type: str) -> ModelShape:
    """(`path`: a config.json or its parsed dict.) The shape of a llama-like model (Llama, Qwen2, Mistral, Gemma: q/k/v/o + gated FFN) from its
    HF config.json, with every layer matrix stored as `weight_type` (a mix such as Q4_K_M takes its
    main type for the layers and Q6_K for the LM head, as llama.cpp's quantizer does)."""
    if isinstance(path, dict):
        cfg, path = path, Path(str(path.get("_name_or_path", "config")), "config.json")
    else:
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ShapeError(f"cannot read {path}: {error}") from None
    cfg = cfg.get("text_config", cfg)
    try:
        n_layer, n_embd = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
        n_head, n_ff, n_vocab = int(cfg["num_attention_heads"]), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    except KeyError as missing:
        raise ShapeError(f"{path.name} lacks {missing}: not a llama-like config") from None
    n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
    head = int(cfg.get("head_dim") or n_embd // n_head)
    layer_type, out_type = MIXES.get(weight_type.upper(), (weight_type.upper(), weight_type.upper()))

    def stored(type_name, n):
        block, size = type_size(type_name)
        return (n + block - 1) // block * size

    # a layer's matrices by the length of their rows: q, k, v, gate and up read the hidden state; o
    # reads the attention heads; down reads the feed-forward width (row length, weight rows)
    matrices = [(n_embd, n_head * head + 2 * n_head_kv * head + 2 * n_ff), (n_head * head, n_embd), (n_ff, n_embd)]
    n_out = n_vocab * n_embd
    rows = [("layer", layer_type, n_layer * length * n, n_layer * stored(layer_type, length * n), n_layer * n)
            for length, n in matrices]
    rows += [("output", out_type, n_out, stored(out_type, n_out), n_vocab),
             ("other", "F32", n_layer * 2 * n_embd + n_embd, 4 * (n_layer * 2 * n_embd + n_embd), 0)]
    if not cfg.get("tie_word_embeddings", False):
        rows.append(("embedding", layer_type, n_out, stored(layer_type, n_out), n_vocab))
    name = f"{cfg.get('_name_or_path') or path.parent.name or 'model'} ({weight_type})"
    return ModelShape(name, str(cfg.get("model_type", "llama")), n_layer, n_embd, n_head, n_head_kv, head, head,
                      n_vocab, _group(rows))


def load_shape(spec) -> ModelShape:
    """A GGUF path, or `config.json:TYPE` (an HF config and a weight type)."""
    text = str(spec)
    if ":" in text and text.rsplit(":", 1)[0].endswith(".json"):
        config, weight_type = text.rsplit(":", 1)
        return from_config(Path(config).expanduser(), weight_type)
    if text.endswith(".json"):
        raise ShapeError(f"{text}: a config.json needs a weight type, e.g. {text}:Q4_0")
    return from_gguf(Path(text).expanduser())


def type_class(type_name: str) -> str:
    """The kernel family a GGML type's matrix products use."""
    t = type_name.upper()
    if t in ("F32", "F16", "BF16"):
        return "float"
    if t.startswith("Q") and not t.endswith("_K") and "_K_" not in t:
        return "legacy"  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: 32-element blocks
    return "kquant"      # Q2_K..Q6_K and the i-quants: 256-element super-blocks
