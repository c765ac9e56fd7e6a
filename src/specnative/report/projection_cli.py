"""`specnative project RUN_DIR --hardware NAME[,NAME...]`: a run's measured acceptance priced on
other hardware with the cost model. Every line it prints and every file it writes is labelled
[projected]; a refusal (unknown hardware, a bad field in a devices file, a serve run, a run with no
acceptance by position, a model file that cannot be found or whose sha256 is not the run's, an
output path through a file) is one line and writes nothing.

`specnative project --bench TESTS --model MODEL --hardware NAMES`: llama-bench's tests priced on
each device (analysis/projection/bench.py), printed as markdown, csv or json; a refusal (unknown
device or type, a malformed config, a test it cannot price) is one line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specnative.analysis.projection.bench import BenchError, bench, load_model, parse_tests
from specnative.analysis.projection.bench import table as bench_table
from specnative.analysis.projection.cost import LABEL
from specnative.analysis.projection.cuda import KERNEL_SETS
from specnative.analysis.projection.device import DeviceError, from_gpu_name, load_devices, resolve, with_kernel_set
from specnative.analysis.projection.project import ProjectionError, shape_label
from specnative.analysis.projection.shape import ShapeError
from specnative.report.projection_output import bench_text, write


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specnative project", description=(
        "Project a sweep run's speedup to hardware you don't have: the run's measured acceptance by position "
        "(with its interval) and the cost model's step, verify and draft costs on each device, each row priced "
        "by what it drafted (a chain of k, a DFlash block of k+1, a tree's nodes and levels). Model files are "
        "checked against the run's recorded sha256. Output is labelled [projected] and never enters "
        "traces.csv. See docs/projection.md."))
    p.add_argument("run_dir", type=Path, nargs="?", help="a sweep's run folder (its traces.csv and provenance.json)")
    p.add_argument("--hardware", default=None,
                   help="device names, comma-separated, each priced once (specnative project --list-hardware), or "
                        "gpu:NAME to pick the shipped device an nvidia-smi name matches")
    p.add_argument("--devices", type=Path, default=None, help="a TOML file of your own devices (same form as the "
                   "shipped table; its entries win; every field checked)")
    p.add_argument("--models", type=Path, action="append", default=[],
                   help="a folder to look for the run's model files in (repeatable; searched after the run's "
                        "recorded paths and before the model cache; the first file with the run's sha256 is taken)")
    p.add_argument("-o", "--out", type=Path, default=None, help="output folder (default: RUN_DIR/projection)")
    p.add_argument("--list-hardware", action="store_true", help="list the known devices and their sources")
    bench = p.add_argument_group("llama-bench for hardware you don't have (no run folder)")
    bench.add_argument("--bench", default=None, metavar="TESTS",
                       help="llama-bench's tests to price, comma-separated: ppN, tgN, ppA-B (e.g. pp512,tg128,pp1-16); "
                            "one row per (hardware, test)")
    bench.add_argument("--model", type=Path, default=None, help="with --bench: a GGUF file or an HF config.json")
    bench.add_argument("--type", default=None, help="with --bench and a config.json: the weight type (Q4_0, Q4_K_M, F16, ...)")
    bench.add_argument("--flash-attn", choices=("on", "off"), default="off", help="with --bench: llama.cpp's -fa (default off)")
    p.add_argument("--cuda-kernels", choices=KERNEL_SETS, default=None,
                   help="price CUDA devices with this llama.cpp build's kernel selection: vendored (default), or "
                        "early-2024 for builds before MMQ ran on int8 tensor cores (June 2024)")
    bench.add_argument("--output", choices=("md", "csv", "json"), default="md", help="with --bench: the format printed")
    return p


def _names(spec: str, devices_file) -> list:
    names = []
    for part in spec.split(","):
        part = part.strip()
        if part.startswith("gpu:"):
            found = from_gpu_name(part[4:])
            if found is None:
                raise DeviceError(f"no shipped device matches the GPU name {part[4:]!r}: name one with --hardware "
                                  "or describe it in a --devices file")
            names.append(found.name)
        elif part:
            names.append(part)
    return resolve(names, devices_file)


def _devices(args) -> list:
    return with_kernel_set(_names(args.hardware, args.devices), args.cuda_kernels)


def _bench(args) -> int:
    """`project --bench`: every (hardware, test) priced and printed; refusals raise before anything prints."""
    if args.run_dir is not None:
        raise BenchError("--bench prices a model, not a run folder: give --model FILE, not RUN_DIR")
    if args.model is None or args.hardware is None:
        raise BenchError("--bench needs --model FILE (a GGUF or a config.json) and --hardware NAME[,NAME...]")
    tests = parse_tests(args.bench)
    devices = _devices(args)
    shape = load_model(args.model, args.type)
    rows = bench(shape, devices, tests, flash_attn=args.flash_attn == "on", type_label=args.type.upper() if args.type else None)
    sys.stdout.write(bench_text(bench_table(rows), args.output))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.list_hardware:
            table = load_devices()
            if args.devices is not None:
                table.update(load_devices(args.devices))
            for name, d in table.items():
                print(f"{name:<12} {d.backend:<5} {d.mem_bw_gbs:>6g} GB/s  {d.label}: {d.source}")
            return 0
        if args.bench is not None:
            return _bench(args)
        if args.run_dir is None or args.hardware is None:
            raise ProjectionError("give a run folder and --hardware NAME[,NAME...] (or --list-hardware)")
        devices = _devices(args)
        from specnative.models.presets import cache_dir

        search = [*args.models, cache_dir()]
        out = args.out or args.run_dir / "projection"
        df, notes, paths = write(args.run_dir, out, devices, search)
    except (ProjectionError, DeviceError, ShapeError, BenchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"{LABEL} note: {note}")
    for _, r in df.iterrows():
        print(f"{LABEL} {r['device']}: {r['target_model']} {r['drafter']} {shape_label(r['draft_shape'], r['k'])} "
              f"N={r['concurrency']} "
              f"ctx={r['ctx_len']}: tau {r['tau']:.2f}, c {r['c']:.2f}, speedup {r['speedup']:.2f} "
              f"({r['speedup_lo']:.2f}-{r['speedup_hi']:.2f})")
    for path in paths:
        print(f"{LABEL} wrote {path}")
    return 0
