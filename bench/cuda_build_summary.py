"""Summarise a CUDA build made by bench/build_cuda.sh: wall time, where the compile time goes
(by ggml-cuda kernel family, from ninja's log), and the sizes of what travels.

The per-family seconds say what each ggml CUDA option saves: GGML_CUDA_FA=OFF empties the
fattn-* kernels (their files still compile, to near nothing), each extra GGML_CUDA_FA_QUANTS
combination adds one fattn-vec file like the f16-f16 one, and each extra architecture in
CMAKE_CUDA_ARCHITECTURES repeats the device part of every .cu file.
"""
import argparse
import os
import re
from collections import defaultdict

# (family, pattern on the ninja output path); first match wins
FAMILIES = [
    ("cuda: fattn-vec instances (FA, one per K-V type pair)", r"template-instances/fattn-vec"),
    ("cuda: fattn-mma instances (FA, tensor cores)", r"template-instances/fattn-mma"),
    ("cuda: fattn-tile instances (FA, no tensor cores)", r"template-instances/fattn-tile"),
    ("cuda: mmq instances (quantized matmul)", r"template-instances/mmq"),
    ("cuda: mmf instances (float matmul)", r"template-instances/mmf"),
    ("cuda: other FA files (fattn*.cu)", r"ggml-cuda\.dir/fattn[^/]*\.cu\.o$"),
    ("cuda: other .cu files", r"ggml-cuda\.dir/.*\.cu\.o$"),
    ("cuda: host C++ and link", r"ggml-cuda"),
    ("ggml-cpu", r"ggml-cpu"),
    ("ggml-base, ggml", r"ggml"),
    ("libllama", r"src/CMakeFiles/llama\.dir|libllama"),
    ("tools (common, llama-bench, llama-speculative-simple)", r"."),
]


def read_ninja_log(build_dir):
    """Last entry per output: {output: seconds}."""
    seconds = {}
    with open(os.path.join(build_dir, ".ninja_log")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start_ms, end_ms, _mtime, output = line.split("\t")[:4]
            seconds[output] = (int(end_ms) - int(start_ms)) / 1000.0
    return seconds


def family_of(output):
    for name, pattern in FAMILIES:
        if re.search(pattern, output):
            return name
    return "other"


def mib(n):
    return n / 2**20


def file_sizes(folder):
    """Regular files (not symlinks) under folder: {relative path: bytes}."""
    sizes = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", required=True)
    ap.add_argument("--prebuilt", required=True)
    ap.add_argument("--carry", required=True)
    ap.add_argument("--name", default="cuda-prebuilt", help="prefix of the packed parts in --carry")
    ap.add_argument("--wall-configure", type=int, required=True)
    ap.add_argument("--wall-build", type=int, required=True)
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--options", default="")
    args = ap.parse_args()

    seconds = read_ninja_log(args.build)
    by_family = defaultdict(lambda: [0, 0.0, 0.0])  # files, sum s, max s
    for output, s in seconds.items():
        entry = by_family[family_of(output)]
        entry[0] += 1
        entry[1] += s
        entry[2] = max(entry[2], s)
    total = sum(e[1] for e in by_family.values())

    print(f"options: {args.options.strip()}")
    print(f"wall: configure {args.wall_configure} s, build {args.wall_build} s "
          f"({args.wall_build / 60:.1f} min) with {args.jobs} jobs; "
          f"sum of per-step times {total:.0f} s")
    print()
    print("| family | steps | sum of step times (s) | share | slowest step (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, _ in FAMILIES:
        if name in by_family:
            n, s, longest = by_family[name]
            print(f"| {name} | {n} | {s:.0f} | {100 * s / total:.1f} % | {longest:.0f} |")
    print()
    print("| file | MiB |")
    print("| --- | ---: |")
    sizes = file_sizes(args.prebuilt)
    for path, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        if size >= 2**20 / 10:
            print(f"| {path} | {mib(size):.1f} |")
    print(f"| all of {os.path.basename(args.prebuilt)} ({len(sizes)} files) | {mib(sum(sizes.values())):.1f} |")
    parts = sorted(p for p in os.listdir(args.carry) if p.startswith(f"{args.name}.tar.xz.part"))
    packed = sum(os.path.getsize(os.path.join(args.carry, p)) for p in parts)
    print(f"| compressed (xz), {len(parts)} part(s) in {args.carry} | {mib(packed):.1f} |")


if __name__ == "__main__":
    main()
