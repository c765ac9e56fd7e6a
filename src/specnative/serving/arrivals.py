"""Request sources for serving under load: who arrives when, with which prompt, wanting how many
tokens. A request is a generic (arrival time, prompt tokens, output length) triple, so that a
seeded arrival process over the built-in prompt suite, a dataset with recorded reply lengths, or
a trace file all feed the engine the same way (serve.py).

Arrival processes as vLLM's benchmark_serving draws them: at rate R requests per second, the gaps
are gamma-distributed with shape `burstiness` and mean 1/R (burstiness 1 is a Poisson process,
below 1 burstier, above 1 more regular); R = inf sends every request at t = 0. The first request
arrives at t = 0. A seed fixes the whole trace, so spec off and on replay the same one.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Request:
    arrival_s: float     # seconds after the start of the run
    prompt: tuple        # token ids
    output_len: int      # tokens to generate (the first included)
    label: str = ""      # where it came from (a task category, a dataset row id)


def parse_rate(text) -> float:
    """A request rate from the command line: a positive number or 'inf'."""
    try:
        rate = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"a request rate is a positive number or 'inf', not {text!r}") from None
    if not rate > 0:  # NaN fails too
        raise ValueError(f"a request rate must be > 0 (or 'inf'), not {text!r}")
    return rate


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """n arrival times in seconds, non-decreasing, the first at 0 (see the module docstring)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of requests must be a positive integer, not {n!r}")
    rate = parse_rate(rate)
    if not (isinstance(burstiness, (int, float)) and burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, not {burstiness!r}")
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def build_trace(prompts: list, output_lens, rate: float, n_requests: int, burstiness: float = 1.0,
                seed: int = 0, labels: list | None = None) -> list[Request]:
    """n_requests requests over `prompts` (token lists, drawn in a seeded order, cycling) with
    output lengths `output_lens` (one per prompt, or one int for all) at the given arrival process."""
    if not prompts:
        raise ValueError("no prompts to build requests from")
    lens = [output_lens] * len(prompts) if isinstance(output_lens, int) else list(output_lens)
    if len(lens) != len(prompts) or any(int(n) < 1 for n in lens):
        raise ValueError("output lengths must be one positive integer per prompt")
    times = arrival_times(n_requests, rate, burstiness, seed)
    order = np.random.default_rng([seed, 1]).permutation(max(n_requests, len(prompts))) % len(prompts)
    labels = labels or [""] * len(prompts)
    return [Request(float(times[i]), tuple(int(t) for t in prompts[j]), int(lens[j]), labels[j])
            for i, j in enumerate(order[:n_requests])]


def write_trace(path, requests: list[Request]) -> Path:
    """A replayable trace: one JSON line per request (arrival_s, prompt token ids, output_len, label)."""
    path = Path(path)
    with path.open("w") as f:
        for r in requests:
            f.write(json.dumps({"arrival_s": r.arrival_s, "prompt": list(r.prompt),
                                "output_len": r.output_len, "label": r.label}) + "\n")
    return path


MAX_TOKEN_ID = 2**31  # llama.cpp's token ids are int32


def read_trace(path) -> list[Request]:
    """Requests from a trace file (write_trace's format); a bad line is named in the error, and a
    file that cannot be read as text is a ValueError too."""
    path = Path(path)
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a trace file") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror or error})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
            arrival, prompt, length = float(entry["arrival_s"]), entry["prompt"], entry["output_len"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{where}: not a trace line with arrival_s, prompt and output_len ({error})") from None
        if not (math.isfinite(arrival) and arrival >= 0):
            raise ValueError(f"{where}: arrival_s must be a finite number >= 0")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt)):
            raise ValueError(f"{where}: prompt must be a non-empty list of token ids")
        if not all(0 <= t < MAX_TOKEN_ID for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < MAX_TOKEN_ID)
            raise ValueError(f"{where}: token id {bad} is not a vocabulary index (0 to {MAX_TOKEN_ID - 1})")
        if not (isinstance(length, int) and not isinstance(length, bool) and length >= 1):
            raise ValueError(f"{where}: output_len must be an integer >= 1")
        if out and arrival < out[-1].arrival_s:
            raise ValueError(f"{where}: arrival_s goes back in time (requests must be in arrival order)")
        out.append(Request(arrival, tuple(prompt), length, str(entry.get("label", ""))))
    if not out:
        raise ValueError(f"{path}: the trace has no requests")
    return out
