"""The projection's outputs [projected]: projection.csv (project.table), projection.md and the
speedup figure against concurrency per device, written by `specnative project` (projection_cli.py)
from analysis/projection's numbers. The folder is made only once the projection succeeded."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specnative.analysis.projection.cost import LABEL
from specnative.analysis.projection.project import ProjectionError, project_run, shape_label, table


def figure(df, stem: Path) -> list:
    """Projected speedup against concurrency, one line per device (and context), interval bars."""
    from matplotlib.figure import Figure

    from specnative.report.figures import save

    groups = list(df.groupby(["target_model", "drafter", "draft_shape", "k", "temperature"], dropna=False))
    fig = Figure(figsize=(6.4, 4.2 * max(len(groups), 1)))
    axes = fig.subplots(max(len(groups), 1), 1, squeeze=False)[:, 0]
    devices = list(dict.fromkeys(df["device"]))
    contexts = sorted(set(df["ctx_len"]))
    styles = ["-", "--", ":", "-."]
    for ax, ((target, drafter, shape, k, temp), g) in zip(axes, groups):
        for (device, ctx), line in g.groupby(["device", "ctx_len"]):
            style = dict(color=f"C{devices.index(device) % 10}", ls=styles[contexts.index(ctx) % len(styles)])
            line = line.groupby("concurrency", as_index=False)[["speedup", "speedup_lo", "speedup_hi"]].median()
            x = line["concurrency"].to_numpy(float)
            s = line["speedup"].to_numpy(float)
            err = np.vstack([np.clip(s - line["speedup_lo"], 0, None), np.clip(line["speedup_hi"] - s, 0, None)])
            ax.errorbar(x, s, yerr=err, marker="o", capsize=3, label=f"{device}, ctx {ctx}", **style)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("speedup [projected]")
        ax.set_title(f"{LABEL} {target}, {drafter} {shape_label(shape, k)} T={temp}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{LABEL} speedup from the run's measured acceptance and modelled costs", fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def markdown(df, notes: list, run_dir: Path) -> str:
    lines = [f"# {LABEL} Speedup on other hardware", "",
             f"{LABEL} From the measured acceptance of {run_dir.name} (tau per round, 95 % bootstrap interval over "
             "rounds) and the cost model's step, verify and draft times per device. The interval also widens "
             "1 + c by the device's cost error. These are projections, not measurements: see docs/projection.md "
             "for when they hold.", ""]
    lines += [f"{LABEL} note: {n}" for n in notes]
    lines += ["", "| [projected] device | target | drafter | drafts | N | ctx | tau | step ms | c "
                  "| speedup (interval) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {LABEL} {r['device']} | {r['target_model']} | {r['drafter']} | "
                     f"{shape_label(r['draft_shape'], r['k'])} | {r['concurrency']} | "
                     f"{r['ctx_len']} | {r['tau']:.2f} | {r['step_ms']:.3g} | {r['c']:.2f} | "
                     f"{r['speedup']:.2f} ({r['speedup_lo']:.2f}-{r['speedup_hi']:.2f}) |")
    return "\n".join(lines) + "\n"


def bench_text(df, fmt: str = "md") -> str:
    """`project --bench`'s rows as markdown (llama-bench's layout, each row labelled), csv (exactly
    bench.CSV_COLUMNS) or json (a list of row objects, each with its label)."""
    from specnative.analysis.projection.bench import CSV_COLUMNS

    if fmt == "csv":
        return df[CSV_COLUMNS].round({"avg_ts": 2, "verify_ratio": 4}).to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=1) + "\n"
    cols = ["label", "hardware", "model_type", "test", "n_rows", "kernel", "flash_attn", "avg_ts", "verify_ratio"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        values = [r["label"], r["hardware"], r["model_type"], r["test"], str(r["n_rows"]), r["kernel"],
                  "on" if r["flash_attn"] else "off", f"{r['avg_ts']:.2f}", f"{r['verify_ratio']:.3f}"]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def check_out_dir(out_dir: Path) -> None:
    """A ProjectionError unless out_dir is a folder or can be made one (no file on its way)."""
    for path in (Path(out_dir), *Path(out_dir).parents):
        if path.exists():
            if not path.is_dir():
                raise ProjectionError(f"cannot write the projection to {out_dir}: {path} is a file, not a folder")
            return


def write(run_dir: Path, out_dir: Path, devices: list, search: list) -> tuple:
    """Projects the run and writes projection.csv, projection.md and the figure into out_dir (created
    only once the projection succeeded); returns (dataframe, written paths)."""
    check_out_dir(out_dir)
    projections, notes = project_run(run_dir, devices, search)
    df = table(projections)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "projection.csv", out_dir / "projection.md"]
    df.to_csv(paths[0], index=False)
    paths[1].write_text(markdown(df, notes, Path(run_dir)))
    paths += figure(df, out_dir / "projection_speedup")
    return df, notes, paths
