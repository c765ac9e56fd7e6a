"""`specnative bench`'s command line: llama-bench's flags with its meanings, defaults and value
syntax (comma lists, first-last[+|*step] ranges, repeated flags adding to the list), plus the
speculation flags (-md, --spec-type, --spec-draft-n-max), refused in one line before anything is
loaded or written. The grid of tests is formed as llama-bench forms it (get_cmd_params_instances):
per model and engine settings, the pp tests, then the tg tests, then the pg tests."""
from __future__ import annotations

import argparse
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from specnative.engine import default_threads, drafter_name

OUTPUT_FORMATS = ("md", "csv", "json", "jsonl", "sql")
# llama.cpp's --spec-type names the engine runs (llama-server's spelling); "none" is the row without
SPEC_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
MODEL_FREE = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# llama-bench's flags that specnative bench does not apply (the engine has no such setting here)
NOT_SUPPORTED = ("-d", "--n-depth", "-sm", "--split-mode", "-mg", "--main-gpu", "-nkvo", "--no-kv-offload",
                 "-ts", "--tensor-split", "-ot", "--override-tensor", "-embd", "--embeddings", "-nopo",
                 "--no-op-offload", "-C", "--cpu-mask", "--cpu-strict", "--poll", "-ncmoe", "--n-cpu-moe",
                 "-dev", "--device", "-rpc", "--rpc", "--numa", "--prio", "--delay", "-oe", "--output-err",
                 "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token", "--offline",
                 "-fitt", "--fit-target", "-fitc", "--fit-ctx", "--list-devices", "-lm", "--load-mode",
                 "-nr", "--no-repack", "-noh", "--no-host", "-mmp", "--mmap", "-dio", "--direct-io")
# llama-bench's defaults (cmd_params_defaults); n_batch and n_ubatch: see BATCH_NOTE
DEFAULT_PROMPT, DEFAULT_GEN, DEFAULT_REPS = [512], [128], 5
DEFAULT_BATCH = 512
DEFAULT_K = 3  # llama-server's --spec-draft-n-max default at the pinned commit
BATCH_NOTE = ("the engine's micro-batch equals its batch (n_ubatch = n_batch): -ub must equal -b, and both "
              "default to 512, llama-bench's micro-batch")
TRUTHY, FALSEY, AUTOY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), ("auto", "-1")


class BenchError(ValueError):
    """A flag specnative bench refuses: said in one line, before anything is loaded or written."""


def parse_int_range(text: str, allow_negative: bool = False, flag: str = "") -> list[int]:
    """llama-bench's integer lists: comma-separated first[-last[(+|*)step]] items ("1-16+1",
    "16-128*2", "512,1024"), each range up to last inclusive."""
    item = re.compile(r"(-?\d+)(?:-(\d+)(?:([+*])(\d+))?)?" if allow_negative else r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")
    values = []
    for part in str(text).split(","):
        match = item.fullmatch(part)
        if match is None:
            raise BenchError(f"{flag} {text!r}: not a list of integers or first-last[+|*step] ranges")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        op, step = match.group(3) or "+", int(match.group(4) or 1)
        i = first
        while i <= last:
            values.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise BenchError(f"{flag} {text!r}: the range does not grow (step {op}{step} from {i})")
            i = nxt
    return values


def _ints(values, flag: str, allow_negative: bool = False) -> list[int] | None:
    if not values:
        return None
    return [v for text in values for v in parse_int_range(text, allow_negative, flag)]


def _pairs(values) -> list[tuple[int, int]]:
    out = []
    for text in values or []:
        parts = str(text).split(",")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise BenchError(f"-pg {text!r}: must be two integers, n_prompt,n_gen (e.g. -pg 512,128)")
        out.append((int(parts[0]), int(parts[1])))
    return out


def _flash_attn(values) -> list:
    out = []
    for text in values or ["auto"]:
        for v in str(text).split(","):
            if v.lower() in TRUTHY:
                out.append(True)
            elif v.lower() in FALSEY:
                out.append(False)
            elif v.lower() in AUTOY:
                out.append("auto")
            else:
                raise BenchError(f"-fa {v!r}: must be on|off|auto (or 1|0|-1)")
    return out


def _split(values) -> list[str]:
    return [v for text in values or [] for v in str(text).split(",") if v != ""]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised (argparse would print usage and exit)
        raise BenchError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specnative bench", allow_abbrev=False,
                description="llama-bench with speculation: llama-bench's flags, rows and output formats; "
                            "-md / --spec-type add speculative rows beside each test's plain row, timed "
                            "interleaved with it (docs/bench.md).")
    add = p.add_argument
    add("-m", "--model", action="append", help="target GGUF (comma list; repeatable)")
    add("-p", "--n-prompt", action="append", help="prompt tokens of the pp tests (default 512)")
    add("-n", "--n-gen", action="append", help="generated tokens of the tg tests (default 128)")
    add("-pg", action="append", metavar="PP,TG", help="a prompt-then-generate test (repeatable)")
    add("-b", "--batch-size", action="append", help=f"n_batch (default {DEFAULT_BATCH}; {BATCH_NOTE})")
    add("-ub", "--ubatch-size", action="append", help="n_ubatch (must equal -b)")
    add("-ctk", "--cache-type-k", action="append", help="K cache type: f16 only")
    add("-ctv", "--cache-type-v", action="append", help="V cache type: f16 only")
    add("-t", "--threads", action="append", help="threads (default: the cores this process may use)")
    add("-ngl", "--n-gpu-layers", action="append", help="layers on the GPU (default -1: all)")
    add("-fa", "--flash-attn", action="append", help="flash attention on|off|auto (default auto)")
    add("-r", "--repetitions", type=int, default=DEFAULT_REPS, help="timed repetitions per test (default 5)")
    add("-o", "--output", default="md", help="md|csv|json|jsonl|sql (default md)")
    add("--no-warmup", action="store_true", help="skip the warm-up run before each test")
    add("-md", "--model-draft", default=None, help="draft model GGUF (speculative rows with draft-simple)")
    add("--spec-type", action="append", help="llama-server's --spec-type names, comma list (default with -md: "
        "draft-simple)")
    add("--spec-draft-n-max", action="append", help="draft length k, a list (default 3, llama-server's)")
    return p


@dataclass(frozen=True)
class Spec:
    """One speculative configuration: a --spec-type name and its draft length."""
    spec_type: str
    k: int

    @property
    def drafter(self) -> str:
        return drafter_name(self.spec_type)


@dataclass(frozen=True)
class Test:
    n_prompt: int
    n_gen: int

    @property
    def name(self) -> str:
        if self.n_gen == 0:
            return f"pp{self.n_prompt}"
        return f"tg{self.n_gen}" if self.n_prompt == 0 else f"pp{self.n_prompt}+tg{self.n_gen}"


@dataclass(frozen=True)
class Setting:
    """The engine settings one loaded engine runs at (the outer loops of llama-bench's grid)."""
    model: str
    n_gpu_layers: int
    n_batch: int
    n_ubatch: int
    flash_attn: object
    n_threads: int


@dataclass
class Plan:
    settings: list
    tests: list
    specs: list
    draft: str | None
    reps: int
    output: str
    warmup: bool
    flags: dict = field(default_factory=dict)  # which of llama-bench's flags were given (the md columns)


def parse(argv: list[str]) -> Plan:
    """The plan of a `specnative bench` command line, or BenchError naming the first problem."""
    argv = list(argv)
    for arg in argv:
        if arg.split("=", 1)[0] in NOT_SUPPORTED:
            raise BenchError(f"{arg.split('=', 1)[0]} is llama-bench's, but specnative bench does not apply it "
                             f"(supported: -m -p -n -pg -r -t -ngl -fa -b -ub -ctk -ctv -o -md --spec-type "
                             f"--spec-draft-n-max)")
    a, unknown = build_parser().parse_known_args(argv)
    if unknown:
        raise BenchError(f"unknown argument {unknown[0]!r} (specnative bench --help)")
    if a.output not in OUTPUT_FORMATS:
        raise BenchError(f"-o {a.output!r}: must be one of {'|'.join(OUTPUT_FORMATS)}")
    if a.repetitions < 1:
        raise BenchError(f"-r {a.repetitions}: must be at least 1")
    models = _split(a.model)
    if not models:
        raise BenchError("-m: a target model is needed (llama-bench's default path is not assumed)")
    for m in models:
        if not Path(m).is_file():
            raise BenchError(f"-m {m}: no such file")
    for flag, values in (("-ctk", a.cache_type_k), ("-ctv", a.cache_type_v)):
        bad = [v for v in _split(values) if v != "f16"]
        if bad:
            raise BenchError(f"{flag} {bad[0]}: the engine's KV cache is f16 only")
    prompts = _ints(a.n_prompt, "-p")
    gens = _ints(a.n_gen, "-n")
    pgs = _pairs(a.pg)
    prompts = DEFAULT_PROMPT if prompts is None else prompts
    gens = DEFAULT_GEN if gens is None else gens
    tests = [Test(p, 0) for p in prompts if p > 0] + [Test(0, g) for g in gens if g > 0] + \
            [Test(p, g) for p, g in pgs]
    if not tests:
        raise BenchError("no test: every -p and -n value is 0 and no -pg was given")
    batches = _ints(a.batch_size, "-b") or [DEFAULT_BATCH]
    ubatches = _ints(a.ubatch_size, "-ub")
    if ubatches is not None and any(u != b for b in batches for u in ubatches):
        raise BenchError(f"-ub {','.join(map(str, ubatches))}: {BATCH_NOTE}")
    if any(b < 1 for b in batches):
        raise BenchError("-b: must be at least 1")
    threads = _ints(a.threads, "-t") or [default_threads()]
    if any(t < 1 for t in threads):
        raise BenchError("-t: must be at least 1")
    ngls = _ints(a.n_gpu_layers, "-ngl", allow_negative=True) or [-1]
    fas = _flash_attn(a.flash_attn)
    specs = _specs(a)
    if a.model_draft is None and any(s.spec_type.startswith("draft-") and s.spec_type != "draft-mtp" for s in specs):
        raise BenchError("--spec-type draft-*: needs -md (the draft model or drafter file)")
    if a.model_draft is not None and not Path(a.model_draft).is_file():
        raise BenchError(f"-md {a.model_draft}: no such file")
    settings = [Setting(m, nl, nb, nb, fa, nt) for m, nl, nb, fa, nt in itertools.product(models, ngls, batches, fas,
                                                                                          threads)]
    flags = {"n_threads": a.threads is not None, "n_batch": True, "n_ubatch": a.ubatch_size is not None,
             "flash_attn": a.flash_attn is not None, "n_gpu_layers": a.n_gpu_layers is not None}
    return Plan(settings, tests, specs, a.model_draft, a.repetitions, a.output, not a.no_warmup, flags)


def _specs(a) -> list[Spec]:
    types = _split(a.spec_type)
    if not types and a.model_draft is not None:
        types = ["draft-simple"]
    for t in types:
        if t == "none":
            continue
        if t not in SPEC_TYPES:
            raise BenchError(f"--spec-type {t!r}: must be one of {', '.join(SPEC_TYPES)} (llama-server's names)")
    types = [t for t in types if t != "none"]
    with_file = sorted({t for t in types if t.startswith("draft-") and t != "draft-mtp"})
    if len(with_file) > 1:
        raise BenchError(f"--spec-type {','.join(with_file)}: each reads the one -md file; bench them in separate "
                         f"runs")
    ks = _ints(a.spec_draft_n_max, "--spec-draft-n-max")
    if ks is not None and not types:
        raise BenchError("--spec-draft-n-max: needs -md or --spec-type (there is nothing to draft)")
    ks = ks or [DEFAULT_K]
    if any(k < 1 for k in ks):
        raise BenchError("--spec-draft-n-max: k must be at least 1")
    return [Spec(t, k) for t in dict.fromkeys(types) for k in dict.fromkeys(ks)]
