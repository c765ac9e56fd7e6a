"""Devices a projection can price: memory bandwidth, matrix rates per weight-type class, the
efficiencies that turn peaks into what llama.cpp reaches, and a fixed cost per forward and per
layer. The shipped table (devices.toml beside this module) gives each device's source: its spec
sheet for the peaks, and a fit (which data, which parameters) for the efficiencies and overheads.
A user adds devices in a TOML file of the same form (`--devices FILE`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from specnative.analysis.projection.cuda import KERNEL_SETS, cc_of

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

SHIPPED = Path(__file__).with_name("devices.toml")
CLASSES = ("float", "legacy", "kquant")  # weight-type classes that share a matrix-product kernel family
BACKENDS = ("cpu", "metal", "cuda")


class DeviceError(ValueError):
    """An unknown device name or a malformed devices file."""


@dataclass(frozen=True)
class Device:
    name: str
    label: str
    backend: str
    mem_bw_gbs: float                 # peak memory bandwidth
    tflops: dict                      # peak matrix rate per class (CPU: per thread)
    bw_efficiency: float = 1.0        # share of the peak bandwidth llama.cpp's weight reads reach
    compute_efficiency: float = 1.0   # share of the peak matrix rate its batched products reach
    overhead_forward_us: float = 0.0  # fixed cost of one llama_decode (graph build, sync, sampling setup)
    overhead_layer_us: float = 0.0    # fixed cost per layer (kernel launches, thread barriers)
    threads: int = 1                  # CPU: threads the rates (and the bandwidth) are multiplied by
    batched_bw_efficiency: float = 1.0  # CPU: bandwidth share of a product of >= 2 rows (GEMM paths)
    serial_share: float = 1.0         # CPU: share of an op's shorter part (streaming or arithmetic) not overlapped
    vector_tflops: float = 0.0        # CUDA: the CUDA-core rate of the matrix-vector kernels (MMVQ/MMVF)
    # CPU: time per attention score (one row x one cached cell x one head x one layer) beyond its bytes
    # and FLOPs: the score's own short dot product, its scale and mask, and softmax's exponential. A
    # forward of one row takes the matrix-vector path (a call per score); two or more rows take the
    # tiled path, which shares that work among the rows (attention_score_batched_ns)
    attention_score_ns: float = 0.0
    attention_score_batched_ns: float = 0.0
    # CPU: time per dot product of one weight row with one activation row beyond its bytes and FLOPs
    # (the kernel's per-row setup, horizontal sum and store): narrow matrices pay it more per byte
    dot_ns: float = 0.0
    # CPU: matrix rate per class or GGML type (per thread) of a product with ONE activation row. llama.cpp
    # takes a matrix-vector path there (a vec_dot per weight row, or a repacked type's gemv) and tiled
    # paths from two rows on (llamafile's sgemm, repacked gemm): different kernels, different rates.
    # A class or type it does not name runs its one-row products at `tflops`
    matvec_tflops: dict = field(default_factory=dict)
    # CPU: the memory system's streaming bandwidth with every core streaming, in multiples of one
    # thread's (a streaming-read microbenchmark at 1 thread and at all threads; a spec sheet's
    # bandwidth over one core's). Threads add bandwidth up to it. 0: no cap (threads x mem_bw_gbs)
    bw_threads_max: float = 0.0
    # CUDA: the compute capability (8.9 for an RTX 4090) that selects llama.cpp's kernel per matrix
    # product (cuda.py; 0: priced as an Ampere), operations per weight element that each further
    # column of a matrix-vector kernel (MMVQ / MMVF) costs on the CUDA cores, by class or type, and
    # the share of the matrix-vector kernels' bandwidth the tiled kernels (MMQ / MMF) stream at.
    # Metal: mmvq_column_ops are mul_mv_ext's, at the ALU rate tflops.float (metal.py)
    compute_capability: float = 0.0
    mmvq_column_ops: dict = field(default_factory=dict)
    mmq_bw_efficiency: float = 1.0
    # Metal: mul_mv's operations per weight element and activation row beyond one row, and the share
    # of a stream of the weights that each further pass of a matrix-vector kernel costs (metal.py)
    mv_column_ops: float = 0.0
    matvec_pass_share: float = 1.0
    # CUDA: the llama.cpp build whose kernel selection prices it (cuda.KERNEL_SETS): "vendored", or
    # "early-2024" for builds before MMQ ran on int8 tensor cores (June 2024)
    cuda_kernels: str = "vendored"
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def cc(self) -> int:
        """ggml's integer compute capability (890 for 8.9)."""
        return cc_of(self.compute_capability)

    def column_ops(self, type_name: str, cls: str) -> float:
        """mmvq_column_ops for a weight type: its own entry, else its class's (0 where neither is given)."""
        return self.mmvq_column_ops.get(type_name.upper()) or self.mmvq_column_ops.get(cls, 0.0)

    def rate(self, cls: str, n_rows: int, type_name: str = "") -> float:
        """FLOP/s of a matrix product of one weight class (or, where the device gives one, of that
        weight type: a CPU's Q4_0 and Q8_0 have kernels of their own) over n_rows activation rows.
        (A CUDA device's weight products are priced per kernel in cuda.py; this rate is its attention's.)"""
        if self.backend == "cpu" and n_rows == 1 and (
                type_name.upper() in self.matvec_tflops or cls in self.matvec_tflops):
            peak = self.matvec_tflops.get(type_name.upper()) or self.matvec_tflops[cls]
        else:
            peak = self.tflops.get(type_name.upper()) or self.tflops.get(cls) or self.tflops.get("float")
        scale = self.threads if self.backend == "cpu" else 1
        return peak * 1e12 * scale * self.compute_efficiency

    def _streams(self, per_thread: float) -> float:
        """Bytes/s of `threads` CPU threads each streaming at `per_thread` x mem_bw_gbs, capped by what
        the memory system carries for all of them (bw_threads_max one-thread shares; 0: no cap)."""
        scale = self.threads * per_thread
        if self.bw_threads_max > 0:
            scale = min(scale, self.bw_threads_max)
        return self.mem_bw_gbs * 1e9 * self.bw_efficiency * scale

    @property
    def bandwidth(self) -> float:
        """Bytes/s reached (a CPU's bandwidth is per thread: one thread streams its share of each
        matrix while it computes, up to the memory system's cap for all threads)."""
        if self.backend != "cpu":
            return self.mem_bw_gbs * 1e9 * self.bw_efficiency
        return self._streams(1.0)

    def weight_bandwidth(self, n_rows: int) -> float:
        """Bytes/s at which a matrix product over n_rows activation rows streams its weights: llama.cpp's
        CPU backend takes a matrix-vector path for one row and tiled matrix-matrix paths (llamafile's
        sgemm, repacked kernels) from two rows on, which re-stream the weights (each thread at
        batched_bw_efficiency of the one-row rate, so more threads fit under the memory system's cap)."""
        if self.backend == "cpu" and n_rows >= 2:
            return self._streams(self.batched_bw_efficiency)
        return self.bandwidth

    def with_threads(self, threads: int) -> "Device":
        """The same CPU at another thread count: per-thread rates and bandwidth scale with threads up to
        the memory system's cap on streaming (bw_threads_max), the fixed costs do not (the model's
        assumption; tested at 2 threads from a fit at 1 and a streaming microbenchmark)."""
        if self.backend != "cpu":
            raise DeviceError(f"{self.name} is not a CPU: threads apply to CPUs only")
        return replace(self, name=f"{self.name}@t{threads}", threads=int(threads))




def _is_type(name: str) -> bool:
    from gguf.constants import GGMLQuantizationType

    return name.upper() in GGMLQuantizationType.__members__


# Every field a devices file may give and what it must be: (lowest, whether the lowest itself is
# allowed, highest allowed (None: no bound)); every number finite.
POSITIVE, NON_NEGATIVE, SHARE = (0.0, False, None), (0.0, True, None), (0.0, False, 1.0)
NUMBER_FIELDS = {"mem_bw_gbs": POSITIVE, "vector_tflops": NON_NEGATIVE, "bw_efficiency": SHARE,
                 "compute_efficiency": SHARE, "batched_bw_efficiency": SHARE, "serial_share": SHARE,
                 "overhead_forward_us": NON_NEGATIVE, "overhead_layer_us": NON_NEGATIVE,
                 "attention_score_ns": NON_NEGATIVE, "attention_score_batched_ns": NON_NEGATIVE,
                 "dot_ns": NON_NEGATIVE, "bw_threads_max": NON_NEGATIVE, "threads": (1.0, True, None),
                 "compute_capability": NON_NEGATIVE, "mmq_bw_efficiency": SHARE,
                 "mv_column_ops": NON_NEGATIVE, "matvec_pass_share": SHARE}
TEXT_FIELDS = ("label", "source")
KNOWN = {"backend", "tflops", "matvec_tflops", "mmvq_column_ops", "cost_error", "match", "cuda_kernels",
         *NUMBER_FIELDS, *TEXT_FIELDS}


def _rule(low: float, low_in: bool, high) -> str:
    if high is not None:
        return f"a number in {'[' if low_in else '('}{low:g}, {high:g}]"
    if low == 0 and not low_in:
        return "a positive finite number"
    return f"a finite number >= {low:g}" if low_in else f"a finite number > {low:g}"


def _checked_number(prefix: str, field_name: str, value, low: float, low_in: bool, high=None) -> float:
    """`value` as a float, or a DeviceError naming the device and the field."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= low if low_in else value > low) and (high is None or value <= high)
    if not ok:
        raise DeviceError(f"{prefix}: {field_name} must be {_rule(low, low_in, high)}, not {value!r}")
    return float(value)


def _rates(prefix: str, what: str, table, backend: str) -> dict:
    if not isinstance(table, dict):
        raise DeviceError(f"{prefix}: {what} must be a table of rates by class or type, not {table!r}")
    unknown = sorted(k for k in table if k not in CLASSES and not _is_type(k))
    if unknown or ("float" not in table and what == "tflops"):
        raise DeviceError(f"{prefix}: {what} needs 'float' (and optionally 'legacy', 'kquant' or GGML type "
                          f"names), not {unknown}")
    if table and what == "matvec_tflops" and backend != "cpu":
        raise DeviceError(f"{prefix}: matvec_tflops applies to CPUs only")
    if table and what == "mmvq_column_ops" and backend == "cpu":
        raise DeviceError(f"{prefix}: mmvq_column_ops applies to CUDA and Metal devices only")
    return {k: _checked_number(prefix, f"{what}.{k}", v, *POSITIVE) for k, v in table.items()}


def _device(name: str, entry: dict, where: str) -> Device:
    """One device from its table, every field checked: a DeviceError naming the device and the first
    field that is missing or out of range."""
    prefix = f"{where}: device {name!r}"
    unknown = sorted(set(entry) - KNOWN)
    if unknown:
        raise DeviceError(f"{prefix}: unknown field {unknown[0]!r} (the fields: {', '.join(sorted(KNOWN))})")
    for required in ("backend", "mem_bw_gbs", "tflops"):
        if required not in entry:
            raise DeviceError(f"{prefix} lacks {required!r}")
    backend = entry["backend"]
    if backend not in BACKENDS:
        raise DeviceError(f"{prefix}: backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    tflops = _rates(prefix, "tflops", entry["tflops"], backend)
    matvec = _rates(prefix, "matvec_tflops", entry.get("matvec_tflops", {}), backend)
    column_ops = _rates(prefix, "mmvq_column_ops", entry.get("mmvq_column_ops", {}), backend)
    values = {}
    for key, (low, low_in, high) in NUMBER_FIELDS.items():
        if key in entry:
            values[key] = _checked_number(prefix, key, entry[key], low, low_in, high)
    if "threads" in values:
        if values["threads"] != int(values["threads"]):
            raise DeviceError(f"{prefix}: threads must be a whole number >= 1, not {entry['threads']!r}")
        values["threads"] = int(values["threads"])
    if 0 < values.get("bw_threads_max", 0) < 1:
        raise DeviceError(f"{prefix}: bw_threads_max must be 0 (no cap) or >= 1, not {entry['bw_threads_max']!r}")
    for key in TEXT_FIELDS:
        if key in entry and not isinstance(entry[key], str):
            raise DeviceError(f"{prefix}: {key} must be a string, not {entry[key]!r}")
    if "cost_error" in entry:
        error = _checked_number(prefix, "cost_error", entry["cost_error"], *NON_NEGATIVE)
        if error >= 1:
            raise DeviceError(f"{prefix}: cost_error must be in [0, 1) (a relative error of 1 + c), "
                              f"not {entry['cost_error']!r}")
    match = entry.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
        raise DeviceError(f"{prefix}: match must be a list of names, not {match!r}")
    if "compute_capability" in values and backend != "cuda":
        raise DeviceError(f"{prefix}: compute_capability applies to CUDA devices only")
    for key in ("mv_column_ops", "matvec_pass_share"):
        if key in values and backend != "metal":
            raise DeviceError(f"{prefix}: {key} applies to Metal devices only")
    if "cuda_kernels" in entry:
        values["cuda_kernels"] = checked_kernel_set(prefix, entry["cuda_kernels"], backend)
    return Device(name=name, backend=backend, tflops=tflops, matvec_tflops=matvec, mmvq_column_ops=column_ops,
                  label=entry.get("label", name), source=entry.get("source", ""),
                  extra={k: entry[k] for k in ("cost_error", "match") if k in entry}, **values)


def checked_kernel_set(prefix: str, kernel_set, backend: str = "cuda") -> str:
    """A CUDA kernel set's name (cuda.KERNEL_SETS), or a DeviceError naming what is wrong."""
    if backend != "cuda":
        raise DeviceError(f"{prefix}: cuda_kernels applies to CUDA devices only")
    if kernel_set not in KERNEL_SETS:
        raise DeviceError(f"{prefix}: cuda_kernels must be one of {', '.join(KERNEL_SETS)}, not {kernel_set!r}")
    return kernel_set


def with_kernel_set(devices: list, kernel_set: str | None) -> list:
    """The CUDA devices priced with another llama.cpp build's kernel selection (others unchanged)."""
    if not kernel_set:
        return list(devices)
    return [replace(d, cuda_kernels=checked_kernel_set("--cuda-kernels", kernel_set)) if d.backend == "cuda" else d
            for d in devices]


def load_devices(path=None) -> dict:
    """Devices by name from a TOML file (one [table] per device); the shipped table by default."""
    path = Path(path) if path is not None else SHIPPED
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise DeviceError(f"cannot read devices file {path}: {error}") from None
    return {name: _device(name, entry, path.name) for name, entry in data.items() if isinstance(entry, dict)}


def resolve(names, devices_file=None) -> list:
    """Devices for a comma-separated list (or list) of names: the shipped table, then a user's file
    (whose entries win), each once in the order first named. An unknown name is a DeviceError
    naming the known ones."""
    table = load_devices()
    if devices_file is not None:
        table.update(load_devices(devices_file))
    wanted = list(dict.fromkeys(n.strip() for n in (names.split(",") if isinstance(names, str) else names)
                                if n.strip()))
    if not wanted:
        raise DeviceError("no hardware named: give --hardware NAME[,NAME...]")
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise DeviceError(f"unknown hardware {', '.join(map(repr, unknown))}; known: {', '.join(sorted(table))}")
    return [table[n] for n in wanted]


def from_gpu_name(gpu_name: str):
    """The shipped device whose `match` names occur in an nvidia-smi name (e.g. "NVIDIA H100 80GB
    HBM3" -> h100-sxm), or None."""
    text = gpu_name.lower()
    for device in load_devices().values():
        if any(m.lower() in text for m in device.extra.get("match", [])):
            return device
    return None
