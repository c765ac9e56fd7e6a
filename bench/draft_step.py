#!/usr/bin/env python3
"""The draft step inside speculative rounds beside the draft model's own decode step.

    python bench/draft_step.py [-t THREADS] [-r REPEATS] [-o FILE]

bench/peers.py's draft table puts our draft step in rounds (draft time / drafted positions) beside
the draft model's own decode step. This splits the difference, on the tiny deep pair (peers.py's
tiny set: a 32-layer f32 target, a 2-layer draft; one sequence, greedy, k = 4, N = 128):

* the same draft in rounds against targets of 2, 6, 14 and 32 layers (the 2-layer one a separate
  file with the draft's weights): what the target's verify between two draft steps costs them;
* each with llama.cpp's graph reuse on and off (LLAMA_GRAPH_REUSE_DISABLE, read when a context
  is made): what rebuilding the graph costs, as a round's first draft batch holds two tokens
  after a fully accepted round (the last draft and the bonus) where the others hold one.

Every measurement is interleaved repeat by repeat (order reversed every other repeat); medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = "Photosynthesis is the process by which"
TARGET_LAYERS = (0, 4, 12, 30)  # extra layers on top of the draft's 2 (0: the copy pair's target)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--repeats", type=int, default=11)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-o", "--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.threads < 1 or a.repeats < 1 or a.n_predict < 8:
        raise SystemExit("error: --threads and --repeats must be >= 1, --n-predict >= 8")

    from peerkit.common import WORK

    from specnative.engine import Engine
    from specnative.models import tiny_pair

    models = WORK / "models"
    kw = {"n_ctx": 4096, "n_batch": 512, "n_threads": a.threads, "n_seq_max": 1}
    runs = {}  # (graph reuse, what) -> (kind, engine)
    for reuse in (True, False):
        if reuse:
            os.environ.pop("LLAMA_GRAPH_REUSE_DISABLE", None)
        else:
            os.environ["LLAMA_GRAPH_REUSE_DISABLE"] = "1"
        tag = "on" if reuse else "off"
        draft = None
        for extra in TARGET_LAYERS:
            target, draft = tiny_pair(models, "deep", extra_layers=extra) if extra else tiny_pair(models, "copy")
            runs[(tag, f"in rounds, {2 + extra}-layer target")] = ("spec", Engine(target, draft, **kw))
        runs[(tag, "the draft's own step")] = ("base", Engine(draft, None, **kw))
    os.environ.pop("LLAMA_GRAPH_REUSE_DISABLE", None)

    def run(kind, engine, n):
        if kind == "base":
            return engine.generate(PROMPT, n_predict=n, stop_at_eos=False).step_ms
        s = engine.generate(PROMPT, n_predict=n, spec=True, k=4, stop_at_eos=False)
        return s.times["draft"] / s.totals["drafted"]

    for kind, engine in runs.values():  # warm-up: page cache, first graphs
        run(kind, engine, 16)
    keys = list(runs)
    values = {key: [] for key in keys}
    load = Path("/proc/loadavg").read_text().split()[:3]
    for rep in range(a.repeats):
        for key in keys if rep % 2 == 0 else keys[::-1]:
            kind, engine = runs[key]
            values[key].append(run(kind, engine, a.n_predict))
    own = statistics.median(values[("on", "the draft's own step")])
    lines = [f"threads {a.threads}, {a.repeats} repeats, N = {a.n_predict}, load average at start {' '.join(load)}",
             "", "| graph reuse | draft step | ms per draft position (median) | / the draft's own step, reuse on |",
             "|---|---|---|---|"]
    for (tag, what), v in values.items():
        lines.append(f"| {tag} | {what} | {statistics.median(v):.4f} | {statistics.median(v) / own:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
