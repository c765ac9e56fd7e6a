"""The load sweep's report (report.py hands serve runs here): latency and goodput against request
rate with speculation on and off, the benefit per metric with its interval, the crossover marked,
a summary.md and advice.json (analysis/crossover.py's numbers, with the vLLM and SGLang forms of
analysis/engine_forms.py); vllm_results.jsonl (vllm_result.py) rewritten from the same records."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specnative.analysis import crossover, engine_forms
from specnative.analysis.advisor import load_traces
from specnative.analysis.break_even import serve_table
from specnative.record.schema import serve_rows
from specnative.report import break_even
from specnative.report.figures import save
from specnative.report.record_md import ReportInputError, hardware, load_provenance, provenance_md, unfinished_md
from specnative.report.text import md_table
from specnative.serving import levers, vllm_result
from specnative.serving.verdict import methods_text

CURVES = (("tpot_p50_ms", "p50 TPOT (ms)"), ("tpot_p99_ms", "p99 TPOT (ms)"),
          ("ttft_p50_ms", "p50 TTFT (ms)"), ("e2e_p99_ms", "p99 E2E latency (ms)"))
FIGURES = {"latency_vs_rate": "Latency against request rate, speculation on and off",
           "goodput_vs_rate": "Goodput and output throughput against request rate",
           "benefit_vs_rate": "Speculation's benefit per metric against request rate (> 1: it pays)"}


def _x(rates) -> tuple[np.ndarray, list]:
    """Log2 positions of the rates, 'inf' one step right of the largest finite rate; tick labels."""
    rates = list(rates)
    finite = [r for r in rates if math.isfinite(r)]
    top = math.log2(max(finite)) + 1 if finite else 0.0
    return np.array([math.log2(r) if math.isfinite(r) else top for r in rates]), \
        ["inf" if math.isinf(r) else f"{r:g}" for r in rates]


def _mark(ax, cross: dict, rates, color="k") -> None:
    rate = cross["rate"]
    if rate is None or not (isinstance(rate, float) and math.isfinite(rate)):
        return
    ax.axvline(math.log2(rate), color=color, ls="--", lw=1)
    ax.annotate(f"crossover ~{rate:.3g}/s", (math.log2(rate), 0.98), xycoords=("data", "axes fraction"),
                ha="right", va="top", rotation=90, fontsize=7)


def _on_off(ax, rows: pd.DataFrame, column: str, crosses: dict, metric_for_mark: str | None) -> None:
    for spec, style in (("off", "o-"), ("on", "s-")):
        sub = rows[rows["spec_decode"] == spec].groupby("request_rate")[column]
        mean, lo, hi = sub.mean(), sub.min(), sub.max()
        x, labels = _x(mean.index)
        ax.errorbar(x, mean.values, yerr=[mean.values - lo.values, hi.values - mean.values], fmt=style,
                    capsize=3, label=f"spec {spec}")
        ax.set_xticks(x, labels)
    if metric_for_mark in crosses:
        _mark(ax, crosses[metric_for_mark], None)
    ax.set_xlabel("request rate (req/s, log scale)")
    ax.grid(alpha=0.3)


def plot_latency(rows, crosses, note) -> Figure:
    fig = Figure(figsize=(10, 7), layout="constrained")
    for ax, (column, label) in zip(fig.subplots(2, 2).flat, CURVES):
        _on_off(ax, rows, column, crosses, column if column in crossover.METRICS else None)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"Latency against request rate (bars: min-max over seeded traces). {note}", fontsize=9)
    return fig


def plot_goodput(rows, crosses, slo_text, note) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    _on_off(a, rows, "goodput", crosses, "goodput")
    a.set_ylabel(f"goodput (req/s meeting {slo_text})" if slo_text else "goodput = request throughput (no --slo)")
    _on_off(b, rows, "output_throughput", crosses, "output_throughput")
    b.set_ylabel("output throughput (tokens/s)")
    for ax in (a, b):
        ax.legend(fontsize=8)
    fig.suptitle(note, fontsize=9)
    return fig


def plot_benefit(table, crosses, note) -> Figure:
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for metric, (label, _) in crossover.METRICS.items():
        sub = table[table["metric"] == metric].sort_values("request_rate")
        x, labels = _x(sub["request_rate"])
        low = np.where(np.isfinite(sub["low"]), sub["benefit"] - sub["low"], 0)
        high = np.where(np.isfinite(sub["high"]), sub["high"] - sub["benefit"], 0)
        ax.errorbar(x, sub["benefit"], yerr=[low, high], fmt="o-", capsize=3, label=label)
        ax.set_xticks(x, labels)
    _mark(ax, crosses["output_throughput"], None)
    ax.axhline(1.0, color="k", lw=1)
    ax.set_xlabel("request rate (req/s, log scale)")
    ax.set_ylabel("benefit (on/off for throughput, off/on for latency)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"Bars: the {int(100 * 0.95)} % interval over seeded traces. {note}", fontsize=9)
    return fig


def _fmt(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "inf" if isinstance(value, float) and value == math.inf else "–"
    return f"{value:.{digits}g}"


def levels_md(rows: pd.DataFrame) -> str:
    """Per rate and spec: means over the seeded traces."""
    cols = ["output_throughput", "request_throughput", "goodput", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "itl_p50_ms", "e2e_p50_ms", "queue_p50_ms", "mean_occupancy", "mixed_step_frac",
            "draft_accept_rate", "mean_accept_len", "verify_cost_c", "engine_own_share"]
    table = []
    rows = levers.with_modes(rows)
    for (rate, prefix, spec), g in rows.groupby(["request_rate", "prefix_cache", "spec_decode"], sort=True):
        verdicts = ",".join(sorted(set(g["verdict"].dropna()))) if "verdict" in g else ""
        table.append([_fmt(rate), prefix, spec, len(g)] + [_fmt(g[c].astype(float).mean()) for c in cols] +
                     [verdicts or "–", int(g["kv_cells_left"].max())])
    head = ["rate", "prefix cache", "spec", "traces", "out tok/s", "req/s", "goodput", "TTFT p50", "TTFT p99", "TPOT p50",
            "TPOT p99", "ITL p50", "E2E p50", "queue p50", "occupancy", "mixed", "α", "τ", "c", "own share",
            "verdicts", "KV left"]
    return md_table(head, table)


def crossover_md(table: pd.DataFrame, crosses: dict) -> str:
    lines = []
    for metric, c in crosses.items():
        label = crossover.METRICS[metric][0]
        sure = crossover.decided(table, metric)
        rates = lambda values: ", ".join(_fmt(v) for v in values) or "no rate"
        evidence = (f"at the 95 % level it pays at {rates(sure[crossover.PAYS])} and loses at "
                    f"{rates(sure[crossover.LOSES])} req/s; the other rates are within noise")
        if c["status"] == "crosses":
            lines.append(f"- **{label}**: speculation stops paying at about **{_fmt(c['rate'])} req/s** "
                         f"(point estimates, interpolated in log rate; {evidence})")
        elif c["status"] == "crosses-beyond-last-finite-rate":
            lines.append(f"- **{label}**: above 1 at every finite rate, not at `inf` (all requests at t=0): the "
                         f"crossover lies beyond the largest finite rate ({evidence})")
        elif c["status"] == "never-above-1":
            lines.append(f"- **{label}**: speculation never pays in the measured range, the crossover lies below "
                         f"it ({evidence})")
        elif c["status"] == "above-1-at-every-rate":
            lines.append(f"- **{label}**: above 1 at every rate, the crossover lies beyond the measured range "
                         f"({evidence})")
        else:
            lines.append(f"- **{label}**: no clean crossing ({evidence})")
    bench = [[_fmt(r["request_rate"]), r["label"], _fmt(r["benefit"]),
              f"[{_fmt(r['low'])}, {_fmt(r['high'])}]", r["traces"], r["status"]]
             for _, r in table.sort_values(["metric", "request_rate"]).iterrows()]
    return "\n".join(lines) + "\n\n" + md_table(["rate", "metric", "benefit", "interval", "traces", "status"], bench)


def advice_md(adv: dict) -> str:
    rows = [[b["request_rate"], b["mean_occupancy"]] +
            [f"{b[f'{m}_benefit']} ({b[f'{m}_status']})" for m in crossover.BAND_METRICS] +
            [b["speculation"], f"`{b['llama_server_flags']}`"] for b in adv["load_bands"]]
    return ("On where speculation makes requests faster (p50 TPOT) without costing throughput or goodput; off "
            f"where any of them loses (a benefit within {adv['practical_margin']:.0%} of 1 counts as no "
            "difference).\n\n" +
            md_table(["rate", "occupancy (on)", "p50 TPOT benefit", "throughput benefit", "goodput benefit",
                      "speculation", "llama-server flags"], rows) +
            f"\n\n`disable_by_batch_size`: **{adv['disable_by_batch_size']}** ({adv['disable_by_batch_size_note']}). "
            f"k per batch size: `{json.dumps(adv['k_by_batch_size'])}` ({adv['k_by_batch_size_note']}). "
            "All of it is in advice.json." + engine_forms_md(adv.get("engine_forms")))


def engine_forms_md(forms: dict | None) -> str:
    """The vLLM and SGLang forms of the advice, each with what it is derived from."""
    if not forms:
        return ""
    lines = [f"\n\nIn other engines' forms ({forms['vllm']['derived_from']}):\n"]
    for name, form in (("vLLM", forms["vllm"]), ("SGLang", forms["sglang"])):
        shown = f"`{form['flags']}`" if form.get("flags") else "no flags"
        lines.append(f"- **{name}**: {shown} ({form['note']})")
    return "\n".join(lines)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _draft_shape(rows: pd.DataFrame) -> str | None:
    """The on rows' draft tree spelling; None for chains."""
    if "draft_shape" not in rows:
        return None
    shapes = rows.loc[rows["spec_decode"] == "on", "draft_shape"].dropna().astype(str)
    shapes = shapes[shapes.str.startswith("tree:")]
    return shapes.iloc[0] if len(shapes) else None


def write_serve_report(run_dir: Path, traces: pd.DataFrame, prov: dict, with_synthetic: pd.DataFrame | None = None
                       ) -> dict:
    """Figures, advice.json and summary.md of a load sweep; returns {file name: path}. with_synthetic:
    the rows with the synthetic acceptance replays too (their break-even alpha per rate)."""
    run_dir = Path(run_dir)
    all_rows = levers.with_modes(serve_rows(traces))
    # the crossover and the advice per load band: one prefix-cache mode (off, where both were served)
    main_mode = "off" if (all_rows["prefix_cache"] == "off").any() else all_rows["prefix_cache"].iloc[0]
    rows = all_rows[all_rows["prefix_cache"] == main_mode]
    table = crossover.benefit_table(rows)
    crosses = crossover.crossovers(table)
    adv = crossover.advice(rows, table)
    adv["engine_forms"] = engine_forms.engine_forms(adv, hardware(prov) if prov else "a host not recorded",
                                                    _draft_shape(rows))
    note = f"Self-measured on {hardware(prov)}." if prov else "Hardware not recorded."
    slo_text = next(iter(rows["slo"].dropna()), "") if "slo" in rows else ""
    figures = {"latency_vs_rate": plot_latency(rows, crosses, note),
               "goodput_vs_rate": plot_goodput(rows, crosses, slo_text, note),
               "benefit_vs_rate": plot_benefit(table, crosses, note)}
    out = {}
    for name, fig in figures.items():
        out[f"{name}.png"], out[f"{name}.pdf"] = save(fig, run_dir / name)
    out["advice.json"] = run_dir / "advice.json"
    out["advice.json"].write_text(json.dumps(_json_safe(adv), indent=2) + "\n")
    shown = dict(prov, grid=prov.get("serve") or {})
    parts = [f"# specnative serving report: run {prov.get('run_id', 'n/a')}", *unfinished_md(prov, all_rows),
             "## Where speculation stops paying" + (f" (prefix cache {main_mode})" if all_rows["prefix_cache"].nunique() > 1
                                                    else ""), crossover_md(table, crosses),
             *(["## Do the levers add under load?", section] if (section := levers.section_md(all_rows)) else []),
             "## Which alpha would pay under load", break_even.serve_section_md(
                 serve_table(with_synthetic if with_synthetic is not None else traces)),
             "## Per load level (means over the seeded traces)",
             "Latencies in ms. TTFT counts the queueing delay; TPOT is the mean time per output token after the "
             "first, per request; ITL the gaps between emissions: a speculative round emits its accepted drafts and "
             "the correction together, so ITL counts one gap where TPOT divides it by the tokens it carried. "
             "c = mean decoding iteration on / off - 1 on the same trace; `mixed`: share of decoding iterations "
             "that also prefilled a prompt chunk; verdicts (lossless_method): " + methods_text(
                 rows["lossless_method"].dropna() if "lossless_method" in rows else []) + ".",
             levels_md(all_rows),
             "## Advice per load band", advice_md(adv),
             "## Figures"]
    parts += [f"### {FIGURES[f]}\n\n![{f}]({f}.png)\n\n[PDF]({f}.pdf)" for f in figures]
    parts += ["## Reproducibility record", provenance_md(shown)]
    out["summary.md"] = run_dir / "summary.md"
    out["summary.md"].write_text("\n\n".join(parts) + "\n")
    return out


def write_report(run_dir) -> Path:
    """The serve run's report from its folder (traces.csv + provenance.json); returns summary.md."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportInputError(f"{run_dir}: not a directory (give the serve run's directory)")
    with_synthetic = load_traces(run_dir / "traces.csv", synthetic=True)
    traces = load_traces(with_synthetic)
    if traces.empty:
        raise ReportInputError(f"{run_dir / 'traces.csv'}: a header but no rows: nothing was measured")
    vllm_result.write_results(run_dir)  # the levels in vLLM's names, from the same records
    return write_serve_report(run_dir, traces, load_provenance(run_dir), with_synthetic)["summary.md"]
