"""Batch-invariance probe: are the target's logits for one position the same whether that
position is computed by a 1-token decode step or inside a larger batch?

Reference path (the baseline's shape): greedy generate() of one sequence, one token per step,
then Engine.pending_logits(0): the last generated token decoded as a 1-token step on top of the
KV cache. The same position is then computed along other batch shapes and compared:

  prefill   Engine.prompt_logits(prompt + generated): the whole sequence in one batch
  chunks5   the same with n_batch=5: 5-token batches, the shape of a k=4 verify batch
  4seq      generate() of 4 sequences together (4-row steps, the baseline at concurrency 4),
            then pending_logits(0); compared when sequence 0 produced the same tokens

Reported per model file and shape: max |dlogit|, the 99.9th percentile of |dlogit| over all
vocabulary entries, how many compared positions are bit-identical, and how many flip the argmax.

Only the public API is used, so the same script measures any build of the package: run it with
the interpreter that imports the build you want (see bench/results/batch-invariance/README.md).

    python bench/batch_invariance.py --gemma --tiny --threads 1 --json bench/results/batch-invariance/probe-default.jsonl
    (the invariant build's interpreter) bench/batch_invariance.py ... --json bench/results/batch-invariance/probe-invariant.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import specnative
from specnative import Engine

PROMPTS = [
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Dear team, following our meeting on Tuesday I would like to summarise the decisions we took "
    "about the release schedule, the test plan and who reviews which part of the code.",
]
CONTINUATIONS = (1, 9)   # generated tokens before the compared position
TYPES = ("Q4_0", "Q4_K_M", "Q8_0", "F16", "F32")
# Environment switches of ggml's CPU backend that change the kernel choice at run time.
GGML_ENV = ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE")


# --------------------------------------------------------------------------------------------
# model files
# --------------------------------------------------------------------------------------------
def derived(src: Path, type_name: str, directory: Path) -> Path:
    """`src` requantized to `type_name` in `directory` (written once, then reused)."""
    dst = directory / f"{src.stem.replace('-Q4_K_M', '')}-{type_name}.gguf"
    if not dst.exists():
        tmp = dst.with_suffix(".tmp")
        specnative.quantize(src, tmp, type_name)
        tmp.replace(dst)
    return dst


def gemma_models(types) -> dict:
    from specnative.models.presets import gemma_files

    files = gemma_files()
    q4km = files["Q4_K_M"]
    out = {}
    for t in types:
        out[t] = files[t] if t in files else derived(q4km, t, q4km.parent)
    return out


def tiny_models(types, directory: Path) -> dict:
    """A tiny random llama whose widths are multiples of 256, so K-quants apply to every matrix."""
    from specnative.models import write_tiny_llama

    directory.mkdir(parents=True, exist_ok=True)
    f32 = directory / "tiny-llama-inv-e256-f512-F32.gguf"
    if not f32.exists():
        write_tiny_llama(f32, n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=4)
    return {t: f32 if t == "F32" else derived(f32, t, directory) for t in types}


def tensor_types(path: Path) -> str:
    """Counts of the weight types in the file, e.g. 'Q8_0:7 F32:5' (what the kernels see)."""
    from gguf import GGUFReader

    counts: dict = {}
    for t in GGUFReader(str(path)).tensors:
        if len(t.shape) >= 2:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


# --------------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------------
class Tally:
    """Differences of one batch shape against the 1-token reference, pooled over positions."""

    def __init__(self):
        self.abs_diffs = []
        self.positions = 0
        self.identical = 0
        self.flips = 0
        self.diverged = 0   # 4seq: sequence 0 generated other tokens than the 1-sequence run

    def add(self, reference: np.ndarray, other: np.ndarray) -> None:
        d = np.abs(reference.astype(np.float64) - other.astype(np.float64))
        self.abs_diffs.append(d)
        self.positions += 1
        self.identical += int(np.array_equal(reference, other))
        self.flips += int(np.argmax(reference) != np.argmax(other))

    def summary(self) -> dict:
        d = np.concatenate(self.abs_diffs) if self.abs_diffs else np.zeros(0)
        return {"positions": self.positions, "identical": self.identical, "flips": self.flips,
                "diverged": self.diverged,
                "max_abs": float(d.max()) if d.size else float("nan"),
                "p999_abs": float(np.quantile(d, 0.999)) if d.size else float("nan")}


def probe_model(path: Path, threads: int, flash_attn: bool = False, kv_unified: bool = True,
                gpu_layers: int = 0, n_seq: int = 4) -> dict:
    tallies = {"prefill": Tally(), "chunks5": Tally(), f"{n_seq}seq": Tally()}
    common = dict(n_ctx=1024, n_threads=threads, n_seq_max=n_seq, flash_attn=flash_attn,
                  kv_unified=kv_unified, n_gpu_layers=gpu_layers)
    with Engine(path, **common) as engine, Engine(path, n_batch=5, **common) as chunked:
        for i, prompt in enumerate(PROMPTS):
            tokens = engine.tokenize(prompt).tolist()
            others = [PROMPTS[(i + j) % len(PROMPTS)] for j in range(1, n_seq)]
            for n in CONTINUATIONS:
                run = engine.generate([tokens], n_predict=n, stop_at_eos=False)
                generated = run.tokens[0].tolist()
                reference = np.asarray(engine.pending_logits(0))
                full = tokens + generated
                tallies["prefill"].add(reference, np.asarray(engine.prompt_logits(full)))
                tallies["chunks5"].add(reference, np.asarray(chunked.prompt_logits(full)))

                multi = engine.generate([tokens] + others, n_predict=n, stop_at_eos=False)
                if multi.tokens[0].tolist() == generated:
                    tallies[f"{n_seq}seq"].add(reference, np.asarray(engine.pending_logits(0)))
                else:
                    tallies[f"{n_seq}seq"].diverged += 1
    return {shape: t.summary() for shape, t in tallies.items()}


def build_label() -> str:
    info = specnative.build_info()
    flags = info["system_info"]
    parts = [f"LLAMAFILE={'1' if 'LLAMAFILE = 1' in flags else '0'}",
             f"REPACK={'1' if 'REPACK = 1' in flags else '0'}"]
    parts += [f"{k}={v.decode()}" for k in GGML_ENV if (v := c_getenv(k)) is not None]
    return " ".join(parts)


def c_getenv(name: str):
    """The C environment ggml reads: the extension may set a variable at load time, after Python
    took its os.environ snapshot."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    return libc.getenv(name.encode())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gemma", action="store_true", help="Gemma 3 270M in every --types")
    parser.add_argument("--tiny", action="store_true", help="a tiny llama (widths 256/512)")
    parser.add_argument("--model", action="append", default=[], help="any GGUF file (repeatable)")
    parser.add_argument("--types", default=",".join(TYPES), help="quantization types (comma list)")
    parser.add_argument("--tiny-dir", default="bench/scratch/inv-models")
    parser.add_argument("--threads", type=int, default=None,
                        help="1 is fastest on a busy machine; results do not depend on it")
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash attention on")
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded (-1: all)")
    parser.add_argument("--kv-split", action="store_true",
                        help="one KV stream per sequence (kv_unified=False) instead of a shared one")
    parser.add_argument("--json", help="append one JSON line per model and shape to this file")
    args = parser.parse_args(argv)

    types = [t for t in args.types.split(",") if t]
    models = []
    if args.gemma:
        models += [("gemma3-270m", t, p) for t, p in gemma_models(types).items()]
    if args.tiny:
        models += [("tiny-llama-256", t, p) for t, p in tiny_models(types, Path(args.tiny_dir)).items()]
    models += [(Path(m).stem, "?", Path(m)) for m in args.model]
    if not models:
        parser.error("nothing to probe: give --gemma, --tiny or --model")

    label = (build_label() + (" flash_attn=on" if args.flash_attn else "")
             + (" kv_unified=off" if args.kv_split else "")
             + (f" gpu_layers={args.gpu_layers}" if args.gpu_layers else ""))
    package = Path(specnative.__file__).resolve().parent
    shown = package.relative_to(Path.cwd()) if package.is_relative_to(Path.cwd()) else package
    print(f"# build: {label}  (package {shown})")
    print(f"{'model':16} {'type':7} {'shape':8} {'max|d|':>10} {'p99.9|d|':>10} {'ident':>7} {'flips':>6}  weights")
    out = open(args.json, "a") if args.json else None
    for family, type_name, path in models:
        weights = tensor_types(path)
        for shape, s in probe_model(path, args.threads, args.flash_attn, not args.kv_split,
                                        args.gpu_layers).items():
            print(f"{family:16} {type_name:7} {shape:8} {s['max_abs']:10.4g} {s['p999_abs']:10.4g} "
                  f"{s['identical']:>3}/{s['positions']:<3} {s['flips']:>6}"
                  f"{'  diverged ' + str(s['diverged']) if s['diverged'] else ''}  {weights}", flush=True)
            if out:
                out.write(json.dumps({"build": label, "family": family, "type": type_name,
                                      "file": path.name, "shape": shape, "weights": weights, **s}) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
