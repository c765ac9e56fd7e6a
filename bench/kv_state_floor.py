"""How far the KV-state check's logits move on correct runs, and on planted cache bugs, against its
controls and float arithmetic's floor.

    python bench/kv_state_floor.py            # tiny F32 and F16 pairs (target + 3 % noise draft)

For every correct run (concurrency 1-4, k 3-4, n_predict 8 and 32, draft p_min 0 and 0.5, prefix
cache on and off) it records the spread of (logits on the cache the run left) - (a clean replay's)
in units of float32 epsilon x the largest |logit| (the unit of lossless.noise.float_floor), the
KV-state control's and the batch-shape control's spreads, and the cache-layout control
(lossless.noise.layout_spread). Then the same for each planted cache fault. Writes
bench/results/kv-state-floor/README.md (-o elsewhere).
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from specnative import Engine, build_info, lossless
from specnative.lossless.noise import FLOAT_FLOOR_UNITS, LOGIT_EPS, SAFETY, STATE_FACTOR, layout_spread
from specnative.models import tiny_pair
from specnative.record.provenance import cpu_model
from specnative.run.workloads import MIXED, Workload

FAULTS = ("rollback_short", "rollback_long", "verify_position", "bonus_from_q", "skip_draft_trim")


def moved(engine, prompts, spec_tokens) -> tuple[float, float]:
    """(spread of pending - clean over the sequences, the largest |clean logit|)."""
    pending = lossless.pending_state(engine, len(prompts))
    tokens = [list(map(int, t)) for t in spec_tokens]
    clean = engine._core.replay(prompts, tokens, 0.0, 0)["final_logits"]
    spread = max(float(np.ptp(np.asarray(p, np.float64) - np.asarray(c, np.float64))) for p, c in zip(pending, clean))
    return spread, max(float(np.abs(c).max()) for c in clean)


def survey(engine, workload) -> tuple[list, dict]:
    correct, faults = [], {}
    for conc, k, n, p_min, prefix in itertools.product([1, 2, 3, 4], [3, 4], [8, 32], [0.0, 0.5], [True, False]):
        prompts = workload.cell_prompts(MIXED, conc, 0)[0]
        common = dict(n_predict=n, prefix_cache=prefix)
        base = engine.generate(prompts, **common)
        spec = engine.generate(prompts, spec=True, k=k, draft_p_min=p_min, **common)
        extents = lossless.cache_extents(engine, conc)
        spread, scale = moved(engine, prompts, spec.tokens)
        structural = lossless.cache_problem(engine, prompts, spec.tokens, extents)
        control = lossless.measure_noise(engine, prompts, base.tokens, k)
        layout = layout_spread(engine, prompts, [list(map(int, t)) for t in spec.tokens]) if conc > 1 else 0.0
        correct.append(dict(conc=conc, k=k, n=n, p_min=p_min, prefix="on" if prefix else "off", moved=spread,
                            units=spread / (LOGIT_EPS * scale), state=control.max_state_spread,
                            batch=control.max_spread, layout=layout, structural=structural))
    for fault in FAULTS:
        for conc, k in ((1, 4), (2, 4), (3, 3)):
            prompts = workload.cell_prompts(MIXED, conc, 0)[0]
            engine._core._inject_fault(fault)
            try:
                spec = engine.generate(prompts, n_predict=32, spec=True, k=k)
            finally:
                engine._core._inject_fault("none")
            spread, scale = moved(engine, prompts, spec.tokens)
            faults.setdefault(fault, []).append(spread / (LOGIT_EPS * scale))
    return correct, faults


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).parent / "results" / "kv-state-floor" / "README.md")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = cpu_model()
    lines = ["# The KV-state check against float arithmetic and the cache's layout", "",
             f"Command: `python bench/kv_state_floor.py {' '.join(sys.argv[1:] if argv is None else argv)}` at commit "
             f"{commit}  ", f"Host: {cpu}, CPU backend, {args.threads} thread(s); build {build_info()['build_flags'].strip()}",
             "", "Unit: float32 epsilon x the largest |logit| of the clean replay; the float floor under every "
             f"tolerance is {FLOAT_FLOOR_UNITS} of these units. `moved`: spread of (logits on the cache the run left) - "
             "(a clean replay's); `state`, `batch`: the noise control's KV-state and batch-shape spreads; `layout`: "
             "the cache-layout control (same tokens, each sequence alone vs beside the others). Logits only: "
             "nothing here is timed, so the other jobs sharing the host's cores do not change a number.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("f32", "f16"):
            target, draft = tiny_pair(tmp, "noisy", noise=0.03, **({"dtype": "f16"} if dtype == "f16" else {}))
            with Engine(target, draft, n_ctx=4096, n_batch=512, n_seq_max=8, n_threads=args.threads,
                        kv_unified=True) as engine:
                correct, faults = survey(engine, Workload(target))
            units = np.array([r["units"] for r in correct])
            over_state = [r["moved"] / r["state"] for r in correct if r["state"] > 0]
            zero = sum(1 for r in correct if r["state"] == 0 and r["batch"] == 0)
            allowance = STATE_FACTOR * SAFETY
            beyond_controls = sum(r["moved"] > allowance * max(r["state"], r["batch"]) for r in correct)
            beyond_floor = sum(r["units"] > FLOAT_FLOOR_UNITS for r in correct)
            beyond_all = sum(r["moved"] > allowance * max(r["state"], r["batch"], r["layout"])
                             and r["units"] > FLOAT_FLOOR_UNITS for r in correct)
            lines += [f"## tiny {dtype.upper()} target, 3 % noise draft", "",
                      f"- correct runs: {len(correct)}, structural check clean in "
                      f"{sum(r['structural'] is None for r in correct)}; moved {np.median(units):.0f} units median, "
                      f"{units.max():.0f} at most",
                      f"- moved / KV-state control: median {np.median(over_state):.1f}, at most {max(over_state):.1f}; "
                      f"runs where both controls read exactly 0: {zero}" if over_state else
                      f"- the KV-state control read 0 in every run (both controls in {zero})",
                      f"- correct runs beyond {allowance:g} x the larger control (the allowance without floor or layout "
                      f"control): {beyond_controls}; beyond the float floor alone: {beyond_floor}; beyond the floor "
                      f"and {allowance:g} x the largest of the controls with the layout control: {beyond_all}", ""]
            lines += ["| planted fault | moved (units), per run |", "|---|---|"]
            lines += [f"| {fault} | {', '.join(f'{v:.3g}' for v in values)} |" for fault, values in faults.items()]
            lines += ["", "<details><summary>every correct run</summary>", "",
                      "| conc | k | n | p_min | prefix | moved | units | state | batch | layout |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            lines += [f"| {r['conc']} | {r['k']} | {r['n']} | {r['p_min']:g} | {r['prefix']} | {r['moved']:.3g} | "
                      f"{r['units']:.0f} | {r['state']:.3g} | {r['batch']:.3g} | {r['layout']:.3g} |" for r in correct]
            lines += ["", "</details>", ""]
            print(f"{dtype}: done", file=sys.stderr, flush=True)
    lines += ["Planted faults that change no cache entry (verify_position, bonus_from_q, skip_draft_trim) move "
              "the state by rounding only: the forced replay of their tokens catches them. The rollback faults "
              "move it by 1e5 units and more, and the structural half of the check (the cache's extent) fails "
              "them exactly.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
