#!/usr/bin/env python3
"""One pair's closed loop at one concurrency: off, static chains and a spec policy, interleaved, with
the policy's k histogram and the step timers of its last run (what bench/adaptive.py's rows hide).

    python bench/adaptive_diagnose.py --pair tiny-noisy -c 8 --configs off,k1,k2,adaptive -r 5

A configuration is off, kN (a static chain of N) or a spec policy's spelling (k up to 8)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive import K_MAX, pairs  # noqa: E402

from specnative import DecodeSpec, Engine  # noqa: E402
from specnative.engine import decoding_ms  # noqa: E402
from specnative.run.workloads.suite import SEQUENCE_PROMPTS  # noqa: E402


def spec_of(config: str, n: int) -> DecodeSpec:
    if config == "off":
        return DecodeSpec(n_predict=n)
    if config[0] == "k" and config[1:].isdigit():
        return DecodeSpec(n_predict=n, spec=True, k=int(config[1:]))
    return DecodeSpec(n_predict=n, spec=True, k=K_MAX, spec_policy=config)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="tiny-noisy")
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--configs", default="off,k1,k2,adaptive")
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    pair = pairs([a.pair])[0]
    prompts = list(SEQUENCE_PROMPTS)[:a.concurrency]
    specs = {c: spec_of(c, a.n_predict) for c in a.configs.split(",")}
    with Engine(pair["target"], pair["draft"], n_ctx=8192, n_batch=512, n_seq_max=9, n_threads=a.threads) as engine:
        for spec in specs.values():  # a warm-up each, untimed
            engine.generate(prompts, spec)
        tps, last = {c: [] for c in specs}, {}
        for r in range(a.repeats):
            for config in (list(specs) if r % 2 == 0 else list(specs)[::-1]):
                res = engine.generate(prompts, specs[config])
                tps[config].append(res.decode_tokens / (decoding_ms(res.times) / 1000.0))
                last[config] = res
    for config, res in last.items():
        line = f"{config:>24s}  {statistics.median(tps[config]):8.1f} tokens/s (median of {a.repeats})"
        if specs[config].spec:
            line += (f"  rounds {res.totals['rounds']}  draft {res.times['draft']:.1f} ms  verify {res.times['verify']:.1f} ms"
                     f"  alpha {res.draft_accept_rate:.3f}  k chosen {[int(h) for h in res.totals['k_chosen_hist']]}")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
