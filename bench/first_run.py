"""A newcomer's first run, timed: the README's main job (`python -m specnative.sweep`, the embedded
tiny default), its wall time, where the time went (per context length and phase, from
provenance.json's sweep_timing) and how honest the progress line's ETA was.

    python bench/first_run.py -o bench/results/first-run/fresh-clone [-- extra sweep flags]

The sweep's run folder, with its report, goes to <out>/run; README.md, stderr.txt and
cell_seconds.json beside it.

The sweep runs in a child process with its stderr captured line by line (not a terminal, so one
line per finished cell, each with its ETA); every line is stamped on arrival. The ETA error at the
finished cell nearest 20, 50 and 80 % of the run is against the time actually left.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ETA = re.compile(r"ETA (\d+)m(\d+)s")


def run(out: Path, extra: list[str]) -> tuple[float, list[tuple[float, str]]]:
    command = [sys.executable, "-m", "specnative.sweep", "-o", str(out / "run"), *extra]
    started = time.monotonic()
    child = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = [(time.monotonic() - started, line.rstrip()) for line in child.stderr]
    if child.wait() != 0:
        raise SystemExit(f"the sweep failed (exit {child.returncode}):\n" + "\n".join(l for _, l in lines[-20:]))
    return time.monotonic() - started, lines


def eta_checks(total: float, lines: list[tuple[float, str]]) -> list[tuple[float, float, float]]:
    """(share of the run, ETA said, time actually left) at the cell lines nearest 20/50/80 %."""
    said = [(t, int(m.group(1)) * 60 + int(m.group(2))) for t, line in lines
            if line.startswith("[") and (m := ETA.search(line))]
    checks = []
    if not said:
        return checks
    for share in (0.2, 0.5, 0.8):
        t, eta = min(said, key=lambda item: abs(item[0] - share * total))
        checks.append((t / total, float(eta), total - t))
    return checks


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.out.exists():
        if any(args.out.iterdir()) and not (args.out / "run").is_dir():
            raise SystemExit(f"{args.out} exists and is not an earlier output of this script (no run/ in it): "
                             f"give a new folder")
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    total, lines = run(args.out, extra)
    (args.out / "stderr.txt").write_text("".join(f"{t:8.1f}s  {line}\n" for t, line in lines))
    prov = json.loads((args.out / "run" / "provenance.json").read_text())
    from specnative.report.record_md import sweep_time_md

    checks = eta_checks(total, lines)
    report = [f"# First run: `python -m specnative.sweep {' '.join(extra)}`".rstrip(), "",
              f"Command: `python bench/first_run.py {' '.join(argv)}`  ",
              f"Date: {time.strftime('%Y-%m-%d %H:%M')}; hardware: {prov.get('cpu_model', '?')}, {prov.get('cpu_count', '?')} CPUs; {prov.get('backend', '?')}; "
              f"threads {prov.get('n_threads')}", "",
              f"**Wall time of the whole command: {total:.0f} s** (model generation and quantization on a fresh "
              f"cache included when they ran).", "",
              "## ETA against the time actually left", "",
              "| at | ETA said | actually left | error |", "|---|---|---|---|"]
    report += [f"| {share:.0%} | {eta:.0f} s | {left:.0f} s | {(eta - left) / left:+.0%} |" for share, eta, left in checks]
    report += ["", "## Where the time went", "", sweep_time_md(prov.get("sweep_timing") or []) or "not recorded",
               "", "Per cell (wall s): " + ", ".join(f"{r['cell'].split()[1]} {r['cell'].split()[2]}: {r['wall_s']:.1f}"
                                                    for r in prov.get("sweep_timing") or [])]
    (args.out / "README.md").write_text("\n".join(report) + "\n")
    (args.out / "cell_seconds.json").write_text(json.dumps(
        [{"cell": r["cell"], "wall_s": r["wall_s"]} for r in prov.get("sweep_timing") or []], indent=1))
    print(args.out / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
