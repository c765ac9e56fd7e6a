"""Published llama.cpp CUDA figures: the calibration set of the CUDA cost model and the tests it
never sees, each row with its source, and the GPUs' spec sheets.

Calibration (fitted): llama.cpp's CUDA scoreboard (discussion #15013: Llama 2 7B Q4_0, pp512 and
tg128, `-fa 0`), pull request #15131 (RTX 4090 Llama 8B Q4_0 pp512 at -ub 10..16, flash attention
off; RTX 3090 Llama 8B F16 at -ub 8..16, flash attention on) and pull request #26079 (RTX 5090
Q6_K and DGX Spark Q8_0, --pure files, one forward of 1..8 rows with MMVQ and with MMQ forced).
Test (never fitted): pull request #5625's A100 CodeLlama 34B Q8_0 pp1..pp9, a March 2024 build,
priced with that build's kernel selection (cuda.py, the "early-2024" kernel set).

Model shapes are llama-like configs (shape.from_config). Gemma-4-12B and Qwen3.6-27B are priced with
llama-like stand-ins of their published sizes (layers, width, heads, vocabulary); their other
blocks (Gemma's local attention, Qwen's linear attention) are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

MODELS = {
    "llama2-7b": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                      "intermediate_size": 11008, "vocab_size": 32000, "tie_word_embeddings": False},
    "llama3.2-3b": {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                        "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True},
    "llama3.1-8b": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False},
    "gemma-12b": {"hidden_size": 3840, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
                      "head_dim": 256, "intermediate_size": 15360, "vocab_size": 262144, "tie_word_embeddings": True},
    "qwen-27b": {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4,
                     "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320, "tie_word_embeddings": False},
    "codellama-34b": {"hidden_size": 8192, "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 8,
                          "intermediate_size": 22016, "vocab_size": 32000, "tie_word_embeddings": False},
}


@dataclass(frozen=True)
class Row:
    """One published figure: t/s of llama-bench's test on a GPU (device name of the shipped table)."""
    source: str        # scoreboard | pr15131 | pr26079 | pr5625
    curve: str         # the curve it belongs to (its rows share a model, a type and a kernel)
    device: str
    model: str         # a key of MODELS
    weight_type: str   # a file type as shape.from_config takes it (Q4_0: a Q6_K LM head; Q6_K, Q8_0: every matrix, as --pure writes)
    test: str          # ppN (one prompt of N tokens), tgN
    n_ubatch: int      # rows per forward (llama-bench -ub)
    tps: float
    flash_attn: bool = False
    kernel: str = ""   # a forced kernel family (PR #26079's mvq / MMQ rows), else the source's choice
    role: str = "fit"  # fit | test
    kernel_set: str = "vendored"  # the llama.cpp build's kernel selection (cuda.KERNEL_SETS)

    @property
    def n_prompt(self) -> int:
        return int(self.test[2:]) if self.test.startswith("pp") else 0

    @property
    def n_gen(self) -> int:
        return int(self.test[2:]) if self.test.startswith("tg") else 0


SCOREBOARD = {  # GPU: (device, pp512, tg128), discussion #15013
    "RTX PRO 6000 Blackwell Max-Q": ("rtx-pro-6000-max-q", 12742.48, 260.42),
    "RTX 4090": ("rtx-4090", 11992.70, 186.21),
    "RTX 5080": ("rtx-5080", 8297.36, 181.99),
    "RTX 6000 Ada": ("rtx-6000-ada", 9229.23, 176.07),
    "RTX 3090 Ti": ("rtx-3090-ti", 6567.49, 171.19),
    "RTX 3090": ("rtx-3090", 5174.69, 158.16),
    "RTX 4080 SUPER": ("rtx-4080-super", 8125.15, 148.33),
    "RTX 4080": ("rtx-4080", 8031.64, 142.49),
    "Tesla V100 32GB": ("v100-32gb", 3042.64, 129.08),
    "A40": ("a40", 4609.01, 124.11),
    "Tesla P40": ("p40", 1007.42, 54.74),
    "A100 80GB": ("a100-80gb", 4849.53, 190.88),
    "H100 80GB": ("h100-sxm", 9918.34, 267.81),
}

PR15131_4090_Q4_0 = {10: 1216.63, 11: 1340.94, 12: 1460.17, 13: 1564.21, 14: 1684.51, 15: 1785.59, 16: 1930.5}
PR15131_3090_F16 = {8: 423.63, 9: 450.76, 10: 492.08, 11: 539.89, 12: 585.9, 13: 625.12, 14: 671.95, 15: 706.71,
                    16: 764.17}

PR26079_MODELS = ("llama3.2-3b", "llama3.1-8b", "gemma-12b", "qwen-27b")
PR26079 = {  # (device, pure type): {kernel: [t/s at ne11 1..8 for each of PR26079_MODELS]}
    ("rtx-5090", "Q6_K"): {
        "mmvq": [(359, 189, 108, 56), (655, 360, 207, 107), (947, 521, 300, 158), (1213, 655, 380, 203),
                 (1359, 719, 432, 228), (1548, 799, 474, 256), (1685, 866, 518, 272), (1688, 928, 566, 283)],
        "mmq": [(358, 189, 109, 56), (469, 280, 169, 85), (701, 417, 253, 127), (928, 551, 336, 169),
                (1134, 681, 416, 209), (1361, 814, 497, 249), (1570, 945, 579, 290), (1791, 1075, 659, 331)]},
    ("dgx-spark", "Q8_0"): {
        "mmvq": [(78, 34, 21, 10), (151, 66, 41, 19), (224, 99, 62, 28), (297, 131, 82, 37), (355, 156, 97, 45),
                 (426, 188, 117, 54), (491, 216, 135, 62), (563, 249, 154, 71)],
        "mmq": [(79, 34, 21, 10), (129, 57, 35, 16), (193, 85, 53, 24), (257, 113, 70, 33), (318, 141, 87, 40),
                (381, 168, 104, 49), (443, 196, 121, 56), (504, 223, 138, 64)]},
}

PR5625_A100_34B_Q8_0 = {1: 34.67, 2: 64.67, 4: 108.26, 8: 160.81, 9: 80.38}


def rows() -> list:
    """Every published row, calibration first, then the tests."""
    out = []
    for gpu, (device, pp512, tg128) in SCOREBOARD.items():
        out.append(Row("scoreboard", f"scoreboard {gpu}", device, "llama2-7b", "Q4_0", "pp512", 512, pp512))
        out.append(Row("scoreboard", f"scoreboard {gpu}", device, "llama2-7b", "Q4_0", "tg128", 1, tg128))
    for ub, tps in PR15131_4090_Q4_0.items():
        out.append(Row("pr15131", "RTX 4090 8B Q4_0 -ub", "rtx-4090", "llama3.1-8b", "Q4_0", "pp512", ub, tps))
    for ub, tps in PR15131_3090_F16.items():
        out.append(Row("pr15131", "RTX 3090 8B F16 -ub (FA)", "rtx-3090", "llama3.1-8b", "F16", "pp512", ub, tps,
                       flash_attn=True))
    for (device, weight_type), kernels in PR26079.items():
        for kernel, table in kernels.items():
            for n, values in enumerate(table, start=1):
                for model, tps in zip(PR26079_MODELS, values):
                    out.append(Row("pr26079", f"{device} {model} {weight_type} {kernel}", device, model,
                                   weight_type, f"pp{n}", n, float(tps), kernel=kernel if n > 1 else ""))
    for n, tps in PR5625_A100_34B_Q8_0.items():
        out.append(Row("pr5625", "A100 CodeLlama 34B Q8_0 (early-2024 build)", "a100-80gb", "codellama-34b", "Q8_0",
                       f"pp{n}", n, tps, role="test", kernel_set="early-2024"))
    return out


# Spec sheets (dense rates, no sparsity): GB/s, SMs, boost GHz, FP32 TFLOPS (the CUDA cores: MMVQ,
# MMVF), FP16 tensor TFLOPS (cuBLAS, MMF; GeForce: FP32 accumulate), INT8 TOPS (MMQ: int8 tensor
# cores from Turing on; dp4a on Pascal sm_61 and Volta), compute capability, label, nvidia-smi names.
GPUS = {
    "rtx-3060-12gb": (360, 28, 1.777, 12.7, 25.4, 101.6, 8.6, "NVIDIA GeForce RTX 3060 12GB", ["RTX 3060"]),
    "rtx-3090": (936, 82, 1.695, 35.6, 71, 284, 8.6, "NVIDIA GeForce RTX 3090", ["RTX 3090"]),
    "rtx-3090-ti": (1008, 84, 1.86, 40.0, 80, 320, 8.6, "NVIDIA GeForce RTX 3090 Ti", ["RTX 3090 Ti"]),
    "rtx-4060-ti-16gb": (288, 34, 2.535, 22.1, 44.2, 176.8, 8.9, "NVIDIA GeForce RTX 4060 Ti 16GB", ["RTX 4060 Ti"]),
    "rtx-4070": (504, 46, 2.475, 29.1, 58.3, 233.2, 8.9, "NVIDIA GeForce RTX 4070", ["RTX 4070"]),
    "rtx-4080": (717, 76, 2.505, 48.7, 97.5, 389.9, 8.9, "NVIDIA GeForce RTX 4080", ["RTX 4080"]),
    "rtx-4080-super": (736, 80, 2.55, 52.2, 104.4, 417.6, 8.9, "NVIDIA GeForce RTX 4080 SUPER", ["RTX 4080 SUPER"]),
    "rtx-4090": (1008, 128, 2.52, 82.6, 165.2, 660.6, 8.9, "NVIDIA GeForce RTX 4090", ["RTX 4090"]),
    "rtx-5060-ti-16gb": (448, 36, 2.572, 23.7, 47.4, 189.7, 12.0, "NVIDIA GeForce RTX 5060 Ti 16GB", ["RTX 5060 Ti"]),
    "rtx-5080": (960, 84, 2.617, 56.3, 112.6, 450.2, 12.0, "NVIDIA GeForce RTX 5080", ["RTX 5080"]),
    "rtx-5090": (1792, 170, 2.407, 104.8, 209.5, 838.0, 12.0, "NVIDIA GeForce RTX 5090", ["RTX 5090"]),
    "rtx-a6000": (768, 84, 1.80, 38.7, 154.8, 309.7, 8.6, "NVIDIA RTX A6000", ["RTX A6000"]),
    "rtx-6000-ada": (960, 142, 2.505, 91.1, 364.2, 728.5, 8.9, "NVIDIA RTX 6000 Ada Generation", ["RTX 6000 Ada"]),
    "rtx-pro-6000": (1792, 188, 2.617, 125.0, 500.0, 1000.0, 12.0, "NVIDIA RTX PRO 6000 Blackwell (600 W)",
                     ["RTX PRO 6000 Blackwell Workstation", "RTX PRO 6000 Blackwell Server"]),
    "rtx-pro-6000-max-q": (1792, 188, 2.28, 109.7, 439.0, 878.0, 12.0, "NVIDIA RTX PRO 6000 Blackwell Max-Q (300 W)",
                           ["RTX PRO 6000 Blackwell Max-Q"]),
    "t4": (320, 40, 1.59, 8.1, 65, 130, 7.5, "NVIDIA T4", ["Tesla T4"]),
    "a10": (600, 72, 1.695, 31.2, 125, 250, 8.6, "NVIDIA A10", ["NVIDIA A10"]),
    "a40": (696, 84, 1.74, 37.4, 149.7, 299.3, 8.6, "NVIDIA A40", ["NVIDIA A40"]),
    "l4": (300, 58, 2.04, 30.3, 121, 242.5, 8.9, "NVIDIA L4", ["NVIDIA L4"]),
    "l40": (864, 142, 2.49, 90.5, 181, 362, 8.9, "NVIDIA L40", ["NVIDIA L40"]),
    "l40s": (864, 142, 2.52, 91.6, 366, 733, 8.9, "NVIDIA L40S", ["L40S"]),
    "p40": (347, 30, 1.531, 11.8, 11.8, 47.0, 6.1, "NVIDIA Tesla P40", ["Tesla P40"]),
    "p100": (732, 56, 1.48, 9.3, 18.7, 18.7, 6.0, "NVIDIA Tesla P100 16GB", ["Tesla P100"]),
    "v100-32gb": (900, 80, 1.53, 15.7, 125, 62.8, 7.0, "NVIDIA Tesla V100 32GB", ["V100"]),
    "a100-40gb": (1555, 108, 1.41, 19.5, 312, 624, 8.0, "NVIDIA A100 40GB", ["A100-SXM4-40GB", "A100-PCIE-40GB"]),
    "a100-80gb": (2039, 108, 1.41, 19.5, 312, 624, 8.0, "NVIDIA A100 SXM4 80GB", ["A100-SXM4-80GB", "A100 80GB"]),
    "h100-pcie": (2000, 114, 1.755, 51.2, 756, 1513, 9.0, "NVIDIA H100 PCIe 80GB", ["H100 PCIe"]),
    "h100-sxm": (3350, 132, 1.98, 66.9, 989, 1979, 9.0, "NVIDIA H100 SXM5 80GB", ["H100 80GB HBM3", "H100 SXM"]),
    "h200": (4800, 132, 1.98, 66.9, 989, 1979, 9.0, "NVIDIA H200 141GB", ["H200"]),
    "b200": (8000, 148, 1.965, 80.0, 2250, 4500, 10.0, "NVIDIA B200", ["B200"]),
    "dgx-spark": (273, 48, 2.418, 31.0, 125, 250, 12.1, "NVIDIA DGX Spark (GB10)", ["GB10"]),
}

# Architecture groups whose efficiencies and per-forward cost are fitted together (compute capability).
ARCH = {6.0: "pascal", 6.1: "pascal", 7.0: "volta", 7.5: "turing", 8.0: "ampere-dc", 8.6: "ampere",
        8.9: "ada", 9.0: "hopper", 10.0: "blackwell-dc", 12.0: "blackwell", 12.1: "dgx-spark"}
# An architecture with no calibration row takes another's fitted values: the nearest in kind.
ARCH_FALLBACK = {"turing": "ampere", "blackwell-dc": "hopper"}


def arch_of(device: str) -> str:
    return ARCH[GPUS[device][6]]
