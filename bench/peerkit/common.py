"""What every peer table shares: paths, building llama.cpp's programs from the vendored tree with
our ggml flags, waiting for a quiet machine, the model sets, formatting and provenance."""
from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specnative.record.provenance import cpu_model  # noqa: F401  (the peer tables' host line)

ROOT = Path(__file__).resolve().parent.parent.parent
VENDOR = ROOT / "vendor" / "llama.cpp"
WORK = ROOT / "bench" / "scratch"
BUILD = WORK / "llama-build"
RESULTS = ROOT / "bench" / "results"

# x86 options our CMake sets from /proc/cpuinfo; those absent from build_flags were OFF in our build.
X86_OPTIONS = ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI",
               "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
               "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------
def cmake_defines(info: dict) -> tuple[dict, list]:
    """-D options for llama.cpp's programs that reproduce our ggml configuration. The server is
    configured without TLS and without its web UI (which would be fetched from the network)."""
    notes = []
    flags = {}
    for tok in info.get("build_flags", "").split():
        if "=" in tok:
            key, value = tok.split("=", 1)
            flags[key] = value
    if flags.get("GGML_NATIVE", "OFF").upper() in ("ON", "1", "TRUE"):
        raise SystemExit("error: our build reports GGML_NATIVE=ON; refusing to build the peers natively "
                         "(AMX kernels trap with SIGILL on these VMs)")
    defines = {"CMAKE_BUILD_TYPE": "Release", "BUILD_SHARED_LIBS": "ON", "GGML_NATIVE": "OFF",
               "LLAMA_BUILD_TESTS": "OFF", "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_SERVER": "ON",
               "LLAMA_BUILD_UI": "OFF", "LLAMA_USE_PREBUILT_UI": "OFF"}
    if any(k in flags for k in X86_OPTIONS):
        defines.update({k: "OFF" for k in X86_OPTIONS})
    elif platform.machine() in ("x86_64", "AMD64"):
        notes.append("our build_flags name no x86 options (SPECNATIVE_CPU_AUTO=OFF?): the peers use ggml's "
                     "defaults with GGML_NATIVE=OFF, which may differ from our build")
    defines.update(flags)
    defines["GGML_NATIVE"] = "OFF"
    if info.get("backend", "CPU").upper() == "CUDA":
        defines["GGML_CUDA"] = "ON"
        defines.setdefault("CMAKE_CUDA_ARCHITECTURES", "native")
    return defines, notes


def tool_path(build_dir: Path, name: str) -> Path:
    return build_dir / "bin" / name


def build_tools(info: dict, build_dir: Path, rebuild: bool, targets) -> dict:
    """Configure once, build the named targets that are missing (or all with rebuild). The stamp
    remembers the -D options: other flags than our build reports now mean a fresh configure."""
    targets = list(targets)
    defines, notes = cmake_defines(info)
    stamp = build_dir / "specnative-peers.json"
    old = json.loads(stamp.read_text()) if stamp.exists() else None
    stale = old is not None and old.get("defines") != defines
    missing = [t for t in targets if not tool_path(build_dir, t).exists()]
    configure = ["cmake", "-S", str(VENDOR), "-B", str(build_dir)]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    configure += [f"-D{k}={v}" for k, v in defines.items()]
    todo = targets if (rebuild or stale) else missing
    build = ["cmake", "--build", str(build_dir), "--target", *todo, "-j", str(os.cpu_count() or 2)]
    record = {"defines": defines, "configure": shlex.join(configure), "build": shlex.join(build),
              "llama_commit": info.get("llama_commit"), "notes": notes}
    if not todo:
        log(f"reusing {build_dir}/bin ({', '.join(targets)}); --rebuild to force")
        return old or record
    if stale:
        log("note: the existing peer build used other flags than our build reports now; reconfiguring")
    if not (VENDOR / "CMakeLists.txt").exists():
        raise SystemExit(f"error: {VENDOR} is missing (pip install the project once, it fetches the pinned tree)")
    if (rebuild or stale) and (build_dir / "CMakeCache.txt").exists():
        (build_dir / "CMakeCache.txt").unlink()
    build_dir.mkdir(parents=True, exist_ok=True)
    for note in notes:
        log("note: " + note)
    log("$ " + record["configure"])
    subprocess.run(configure, check=True)
    log("$ " + record["build"])
    t0 = time.time()
    subprocess.run(build, check=True)
    log(f"built {', '.join(todo)} in {time.time() - t0:.0f} s")
    # the stamp's build line names every target this folder holds, not only this call's
    record["build"] = shlex.join(build[:4] + targets + build[4 + len(todo):])
    stamp.write_text(json.dumps(record, indent=1))
    return record


def find_tools(a, info, names) -> tuple[dict, dict]:
    """Paths of llama.cpp's programs: prebuilt (--tools-dir) or built here into --build-dir."""
    if a.tools_dir is not None:
        tools = {t: a.tools_dir / t for t in names}
        missing = [str(p) for p in tools.values() if not p.exists()]
        if missing:
            raise SystemExit(f"error: not found: {', '.join(missing)}")
        return tools, {"prebuilt": str(a.tools_dir), "notes": []}
    build = build_tools(info, a.build_dir, a.rebuild, names)
    return {t: tool_path(a.build_dir, t) for t in names}, build


def run_tool(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def ngl_arg(n: int) -> str:
    """common/arg.cpp reads -1 as 'auto' (fit to memory); all layers is 'all'. llama-bench and the
    llama API read any negative number as all layers."""
    return "all" if n < 0 else str(n)


# ---------------------------------------------------------------------------------------------
# Quiet machine
# ---------------------------------------------------------------------------------------------
def busy_cores(interval: float = 1.0) -> float:
    """CPU cores busy (all processes) over `interval` seconds, from /proc/stat."""
    def read():
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        return sum(parts), idle
    t0, i0 = read()
    time.sleep(interval)
    t1, i1 = read()
    total = max(t1 - t0, 1)
    return (1.0 - (i1 - i0) / total) * (os.cpu_count() or 1)


class Quiet:
    """Waits before each measurement until other processes leave the CPUs alone (we are idle while
    it samples, so whatever it sees is someone else). Keeps the worst value it accepted."""

    def __init__(self, max_busy: float, max_wait: float):
        self.max_busy, self.max_wait = max_busy, max_wait
        self.worst = 0.0
        self.waited = 0.0
        self.gave_up = 0

    def wait(self) -> None:
        start = time.time()
        while True:
            busy = busy_cores(0.5)
            if busy <= self.max_busy:
                self.worst = max(self.worst, busy)
                return
            if time.time() - start > self.max_wait:
                log(f"warning: {busy:.2f} cores busy elsewhere after waiting {self.max_wait:.0f} s; measuring anyway")
                self.worst = max(self.worst, busy)
                self.gave_up += 1
                return
            log(f"  {busy:.2f} cores busy elsewhere (load {os.getloadavg()[0]:.2f}); waiting")
            time.sleep(10)
            self.waited += 10

    def describe(self) -> str:
        return (f"before every measurement at most {self.worst:.2f} cores were busy elsewhere (limit "
                f"{self.max_busy}, waited {self.waited:.0f} s"
                + (f", gave up waiting {self.gave_up}x" if self.gave_up else "") + ")")


def default_max_busy(threads: int) -> float:
    """What leaves our threads their cores, at least 0.25."""
    return max(0.25, (os.cpu_count() or 1) - threads - 0.75)


# ---------------------------------------------------------------------------------------------
# Model sets
# ---------------------------------------------------------------------------------------------
MODEL_SETS = ("tiny", "gemma", "qwen")


def set_names(text: str) -> list:
    """The model sets of a comma list, checked before anything is built or loaded."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODEL_SETS]
    if unknown or not names:
        raise SystemExit(f"error: unknown model set {', '.join(map(repr, unknown)) or 'none given'} "
                         f"({', '.join(MODEL_SETS)})")
    return names


def model_sets(names):
    sets = []
    for name in names:
        if name == "tiny":
            from specnative.models import tiny_pair
            target, draft = tiny_pair(WORK / "models", "deep", extra_layers=30)
            sets.append({"name": "tiny", "title": "tiny deep (2+30 layers, f32) / 2-layer draft",
                         "target": target, "draft": draft, "extra_baselines": [], "swa_full": False})
        elif name == "gemma":
            from specnative.models.presets import gemma_files
            files = gemma_files()
            sets.append({"name": "gemma", "title": "gemma3-270m Q8_0 target / Q4_K_M draft",
                         "target": files["Q8_0"], "draft": files["Q4_K_M"], "extra_baselines": [files["Q4_K_M"]],
                         "swa_full": True})  # ours keeps swa_full=true for rollback; the same cache for both
        elif name == "qwen":
            sets.append(qwen_set())
        else:
            raise SystemExit(f"error: unknown model set {name!r} (tiny, gemma, qwen)")
    return sets


def qwen_set() -> dict:
    """The Qwen2.5-Coder 1.5B target / 0.5B draft pair of the qwen2.5-coder preset, if its files
    are already in the cache (sha256-checked): a benchmark does not download 1.6 GB behind the
    user's back; `specnative models fetch qwen2.5-coder` (or models.presets.qwen_files())
    fetches them."""
    from specnative.models import presets
    if not hasattr(presets, "QWEN_TARGET"):
        raise SystemExit("error: this specnative has no qwen2.5-coder preset")
    directory = presets.cache_dir() / "qwen2.5-coder"
    files = {}
    for role, spec in (("target", presets.QWEN_TARGET), ("draft", presets.QWEN_DRAFT)):
        path = directory / spec.file_name
        if not path.exists():
            raise SystemExit(f"error: {path} is missing; fetch the pair first: "
                             f"specnative models fetch qwen2.5-coder")
        try:
            files[role] = presets.verified(spec, path)
        except presets.FetchError as exc:
            raise SystemExit(f"error: {exc}")
    return {"name": "qwen", "title": "Qwen2.5-Coder 1.5B Instruct Q4_K_M target / 0.5B Instruct Q4_K_M draft",
            "target": files["target"], "draft": files["draft"], "extra_baselines": [], "swa_full": False}


# ---------------------------------------------------------------------------------------------
# Formatting and provenance
# ---------------------------------------------------------------------------------------------
def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=1):
    return "n/a" if x is None or x != x else f"{x:.{nd}f}"


def vals(xs, nd=1):
    return ", ".join(fmt(x, nd) for x in xs)


def pad256(n: int) -> int:
    return (n + 255) // 256 * 256




def gpu_model() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return "; ".join(out.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        return ""


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "csrc"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def rel(p) -> str:
    p = Path(p)
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def show_cmd(cmd) -> str:
    return shlex.join(rel(c) if os.sep in str(c) and Path(c).exists() else str(c) for c in cmd)


def build_lines(build: dict) -> list:
    """How the peers were built, for the end of a report."""
    if build.get("prebuilt"):
        return [f"Peer tools: prebuilt, from `{rel(build['prebuilt'])}` (--tools-dir)."]
    return ["Peers built with:", "",
            f"    {build.get('configure', '')}".replace(str(ROOT) + "/", ""),
            f"    {build.get('build', '')}".replace(str(ROOT) + "/", "")]


def add_build_args(ap) -> None:
    """The options every peer table shares for finding or building llama.cpp's programs."""
    ap.add_argument("--rebuild", action="store_true", help="rebuild llama.cpp's tools")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--build-dir", type=Path, default=BUILD)
    ap.add_argument("--tools-dir", type=Path, default=None,
                    help="use llama.cpp's programs from here instead of building them "
                         "(e.g. our own build with SPECNATIVE_PEER_TOOLS=ON, which shares our ggml)")
