"""Which targets an EAGLE-3 head can be trained for, decided from the GGUF metadata alone.

Training costs minutes to hours, so every reason the result could not run is found before any
of it: a file that is not GGUF, an architecture whose llama.cpp graph does not publish the layer
inputs the head reads (the same list specnative's engine checks before loading a hidden-state
drafter), one whose graph the torch re-implementation does not cover, a head width other than the
target's (the head borrows the target's token embeddings, so llama.cpp needs equal widths), and
target layers that do not exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

# Target architectures whose llama.cpp graph fills t_layer_inp at the pinned commit: the ones
# DFlash, DSpark and EAGLE-3 can read. Gemma 3 and Qwen2, for two, do not.
LAYER_INPUT_ARCHS = (
    "llama", "nanbeige", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma3n",
    "gemma4", "deepseek4", "nemotron_h", "bailingmoe3", "hunyuan_vl", "gpt-oss", "lfm2", "minimax-01",
    "minimax-m2", "mimo2")
# Of those, the graphs gguf_target.py re-implements in torch (to read the features and check them).
TORCH_ARCHS = ("llama",)
# Tensors the torch llama graph reads; any other (biases, rope factors, experts) would be ignored
# silently, so a file that has one is refused instead.
_GLOBAL_TENSORS = {"token_embd.weight", "output_norm.weight", "output.weight"}
_BLOCK_TENSORS = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                  "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}


class TargetError(ValueError):
    """A target the head cannot be trained for; the message says why in one line."""


@dataclass(frozen=True)
class TargetInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_rot: int
    n_ctx_train: int
    rope_base: float
    rms_eps: float

    @property
    def default_layers(self) -> tuple:
        """EAGLE-3's low, middle and high layer (its reference code and llama.cpp's converter:
        2, n/2, n-3), clamped into range for small targets."""
        n = self.n_layer
        return tuple(min(max(i, 0), n - 1) for i in (2, n // 2, n - 3))


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def read_target(path) -> tuple[gguf.GGUFReader, TargetInfo]:
    """The GGUF reader and hyperparameters of `path`; TargetError if it is not a GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise TargetError(f"target not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise TargetError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # noqa: BLE001 - a truncated or corrupt file: the reader's own reason
        raise TargetError(f"cannot read {path} as a GGUF file: {error}") from None
    arch = _field(reader, "general.architecture", "")
    n_embd = int(_field(reader, f"{arch}.embedding_length", 0))
    n_head = int(_field(reader, f"{arch}.attention.head_count", 0) or 0)
    tokens = reader.get_field("tokenizer.ggml.tokens")
    info = TargetInfo(
        path=str(path), arch=arch, n_layer=int(_field(reader, f"{arch}.block_count", 0)), n_embd=n_embd,
        n_head=n_head, n_head_kv=int(_field(reader, f"{arch}.attention.head_count_kv", n_head) or n_head),
        n_ff=int(_field(reader, f"{arch}.feed_forward_length", 0) or 0),
        n_vocab=int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else 0)),
        n_rot=int(_field(reader, f"{arch}.rope.dimension_count", n_embd // n_head if n_head else 0)),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 4096)),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)))
    return reader, info


def _refuse_uncovered(reader: gguf.GGUFReader, info: TargetInfo) -> None:
    """The llama graph variants the torch re-implementation does not compute."""
    where = f"{info.path} (architecture {info.arch})"
    for name in (t.name for t in reader.tensors):
        block, _, rest = name.partition(".")
        covered = name in _GLOBAL_TENSORS or (block == "blk" and rest.partition(".")[2] in _BLOCK_TENSORS)
        if not covered:
            raise TargetError(f"{where} has tensor {name}, which the trainer's torch llama graph does not "
                              f"compute (rope factors, biases and experts are not covered)")
    if _field(reader, f"{info.arch}.attention.scale") is not None:
        raise TargetError(f"{where} sets its own attention scale, which the trainer's torch graph does not cover")
    if _field(reader, f"{info.arch}.rope.scaling.type", "none") not in ("none", None):
        raise TargetError(f"{where} uses rope scaling, which the trainer's torch graph does not cover")
    if info.n_head <= 0 or info.n_embd % info.n_head or info.n_head % max(info.n_head_kv, 1):
        raise TargetError(f"{where}: n_embd {info.n_embd}, heads {info.n_head}/{info.n_head_kv} do not "
                          f"make a llama attention")
    if info.n_rot != info.n_embd // info.n_head:
        raise TargetError(f"{where} rotates {info.n_rot} of {info.n_embd // info.n_head} head dimensions; "
                          f"the trainer's torch graph covers full rotation only")


def check_target(path, *, n_embd: int | None = None, layers=None) -> tuple[TargetInfo, tuple]:
    """(target info, the three target layers) for an EAGLE-3 head of width `n_embd` (None: the
    target's) reading `layers` (None: EAGLE-3's default); TargetError naming the one problem."""
    reader, info = read_target(path)
    where = f"{info.path} (architecture {info.arch or 'unknown'})"
    if info.arch not in LAYER_INPUT_ARCHS:
        raise TargetError(f"an EAGLE-3 head reads the target's layer inputs, which {where} does not publish "
                          f"at this llama.cpp commit")
    if info.arch not in TORCH_ARCHS:
        raise TargetError(f"{where}: the trainer re-implements only the {', '.join(TORCH_ARCHS)} graph in torch "
                          f"(to read its layer inputs)")
    if n_embd is not None and int(n_embd) != info.n_embd:
        raise TargetError(f"a head of n_embd {n_embd} cannot borrow the token embeddings of {where}, which has "
                          f"n_embd {info.n_embd}")
    _refuse_uncovered(reader, info)
    chosen = tuple(int(i) for i in (info.default_layers if layers is None else layers))
    if len(chosen) != 3:
        raise TargetError(f"an EAGLE-3 head reads exactly 3 target layers, not {len(chosen)} ({list(chosen)})")
    bad = [i for i in chosen if not 0 <= i < info.n_layer]
    if bad:
        raise TargetError(f"target layer {bad[0]} does not exist: {where} has layers 0..{info.n_layer - 1}")
    return info, chosen
