"""The reproducibility record of a run, as summary.md shows it: software, build, hardware, models,
the command, warm-up and repeats, the noise control per target and backend, notes."""
from __future__ import annotations

import math
from pathlib import Path

from specnative.analysis.advisor import as_float
from specnative.record.provenance import ProvenanceError, read_provenance
from specnative.record.run_folder import base_cell
from specnative.report.text import fmt, md_table


class ReportInputError(ValueError):
    """A run directory the report cannot use: the message names the file and what is wrong."""


def load_provenance(run_dir: Path) -> dict:
    """provenance.json as a dict; {} when the run has none (the report says so). A damaged one
    is an error: numbers must not be reported under a record that cannot be read."""
    try:
        return read_provenance(run_dir) or {}
    except ProvenanceError as error:
        raise ReportInputError(str(error)) from None


def hardware(prov: dict) -> str:
    gpu = prov.get("gpu")
    if gpu:
        return (f"GPU {gpu.get('name', '?')} ({gpu.get('memory_gb', '?')} GB, driver "
                f"{gpu.get('driver', '?')}), {prov.get('backend') or 'backend not recorded'}")
    cpu = prov.get("cpu_model") or "CPU not recorded"
    return (f"CPU {cpu} ({prov.get('cpu_count', '?')} cores, {prov.get('memory_gb', '?')} GB), "
            f"{prov.get('backend') or 'backend not recorded'}")


def prov_value(prov, key):
    value = prov.get(key)
    return "not recorded" if value is None or value == "" else value


def provenance_md(prov: dict) -> str:
    if not prov:
        return "**provenance.json is missing: these numbers cannot be reproduced or attributed.**"
    rows = [("specnative", prov_value(prov, "specnative_version")),
            ("llama.cpp commit", f"`{prov_value(prov, 'llama_cpp_commit')}`"),
            ("build flags", f"`{prov_value(prov, 'build_flags')}`"),
            ("backend", prov_value(prov, "backend")),
            ("hardware", hardware(prov)),
            ("system info", f"`{prov_value(prov, 'system_info')}`"),
            ("OS / Python", f"{prov_value(prov, 'os')} / {prov_value(prov, 'python')}"),
            ("threads / GPU layers / flash attn",
             f"{prov_value(prov, 'n_threads')} / {prov_value(prov, 'n_gpu_layers')} / {prov_value(prov, 'flash_attn')}"),
            ("warm-up / repeats", repeats_text(prov)),
            ("which k (cost curve)", "measured" if prov.get("which_k") else
             "not measured (the default; pass --which-k)" if "which_k" in prov else "not recorded"),
            ("rejection cells' distributional test", f"at least {prov['dist_positions']} positions"
             if "dist_positions" in prov else "not recorded"),
            ("grid", "; ".join(f"{k}: {v}" for k, v in (prov.get("grid") or {}).items()) or "not recorded"),
            ("preset", prov.get("preset") or "none (models given)"),
            ("date", prov_value(prov, "date")),
            ("run id", prov_value(prov, "run_id"))]
    models = [(m.get("role"), m.get("name"), f"`{m.get('path')}`", m.get("type"), m.get("quant_bits"),
               m.get("n_params"), m.get("size_bytes"), f"`{m.get('sha256')}`")
              for m in prov.get("models") or []]
    return "\n\n".join([
        *_incomplete(prov),
        md_table(["", ""], rows),
        "Command:\n\n```\n" + str(prov_value(prov, "command")) + "\n```",
        md_table(["role", "name", "file", "type", "bits", "params", "bytes", "sha256"], models)
        if models else "Models: not recorded.",
        *noise_control_md(prov)])


def noise_control_md(prov: dict) -> list:
    """The lossless verdict's control per target and backend (provenance noise_control)."""
    noise = prov.get("noise_control") or {}
    if not noise:
        return []
    rows = [[name, fmt(n.get("max_abs_delta"), 3), fmt(n.get("max_spread"), 3), fmt(n.get("tolerance"), 3),
             f"{n.get('flips', 0)}/{n.get('positions', 0)}",
             ", ".join(f"{v} {c}" for v, c in (n.get("verdicts") or {}).items())]
            for name, n in noise.items()]
    return ["Numeric-noise control (the target's own logits, baseline 1-token steps vs k+1-token verify "
            "batches, same tokens teacher-forced, per cell; the lossless verdict's tolerance is "
            "1.25 x the largest logit-gap movement):",
            md_table(["target [backend]", "max |Δlogit|", "max gap movement", "tolerance",
                      "greedy flips / positions", "verdicts"], rows)]


def unfinished_md(prov: dict, traces) -> list:
    """A sweep or serve run that did not finish (interrupted, or still running), said before its
    answer: how many of its planned cells (serve: levels, a request rate's seeded trace) were never
    measured, so that what follows is not read as the whole grid."""
    if prov.get("completed") is not False:
        return []
    if prov.get("mode") == "serve":
        verb, unit, planned = "serve", "levels (request rate, trace seed)", prov.get("levels_planned")
        measured = len(traces[["request_rate", "seed"]].drop_duplicates())
    else:
        verb, unit, planned = "sweep", "cells", prov.get("cells_planned")
        measured = traces["cell_id"].dropna().map(base_cell).nunique()
    if isinstance(planned, int) and planned >= measured:
        missing = f"{planned - measured} of its {planned} planned {unit} were never measured"
    else:  # a run from before the count was recorded
        missing = f"some of its planned {unit} were never measured (how many was not recorded)"
    return [f"**This {verb} run did not finish: {missing}. Everything below covers the measured ones only "
            f"({measured}), not all that was asked for.** `specnative {verb} --resume --out RUN_DIR` measures "
            f"the rest."]


def _incomplete(prov: dict) -> list:
    """Warnings that the grid is not all there: an unfinished sweep, cells it refused to run."""
    said = []
    if prov.get("completed") is False:
        said.append("**The sweep did not finish: this report covers the cells written so far.**")
    refused = prov.get("refused_cells") or []
    if refused:
        said.append("Cells the sweep refused to run (not measured):\n\n" + md_table(
            ["target", "ctx_len", "concurrency", "reason"],
            [[r.get("target"), r.get("ctx_len"), r.get("concurrency"), r.get("reason")] for r in refused]))
    return said


def notes_md(prov: dict) -> str:
    notes = prov.get("notes") or []
    return "\n".join(f"- **{n}**" for n in notes) if notes else "- (no notes recorded)"


def size_text(n_bytes) -> str:
    n = as_float(n_bytes)
    return "" if not math.isfinite(n) else f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def params_text(n) -> str:
    n = as_float(n)
    return "" if not math.isfinite(n) else f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def repeats_text(prov: dict) -> str:
    if prov.get("max_repeats") is None:  # a fixed-count sweep (before adaptive repeats)
        return f"{prov_value(prov, 'warmup')} discarded / {prov_value(prov, 'repeats')} timed; rates are medians"
    return (f"warm-up until two runs agree within {prov.get('warmup_tol', 0):.0%} (at most "
            f"{prov['warmup']} discarded); {prov['repeats']}–{prov['max_repeats']} timed runs, spec off "
            f"and on interleaved, until the speedup's {prov.get('ci_level', 0.95):.0%} interval lies above "
            f"or below 1 or is narrower than {prov.get('ci_width', 0):.0%} of it; rates are pooled over the "
            f"timed runs (total tokens over total time)")


def sweep_time_md(records: list[dict]) -> str | None:
    """summary.md's table of where the sweep's own time went (provenance sweep_timing): seconds
    per phase summed over cells, wall and CPU, by context length."""
    if not records:
        return None
    totals: dict = {}
    for record in records:
        ctx = next((part[4:] for part in record["cell"].split() if part.startswith("ctx=")), "?")
        for phase, spent in record["phases"].items():
            entry = totals.setdefault((ctx, phase), [0.0, 0.0])
            entry[0] += spent["wall_s"]
            entry[1] += spent["cpu_s"]
    wall = sum(r["wall_s"] for r in records)
    lines = ["| ctx_len | phase | wall s | CPU s | share of wall |", "|---|---|---|---|---|"]
    for (ctx, phase), (w, c) in sorted(totals.items(), key=lambda item: (int(item[0][0]) if item[0][0].isdigit()
                                                                         else -1, item[0][1])):
        lines.append(f"| {ctx} | {phase} | {w:.1f} | {c:.1f} | {w / wall:.0%} |" if wall else
                     f"| {ctx} | {phase} | {w:.1f} | {c:.1f} | |")
    return (f"{len(records)} cells, {wall:.0f} s of wall time inside cells (model loading and the grid "
            f"check are outside). CPU s counts every thread.\n\n" + "\n".join(lines))
