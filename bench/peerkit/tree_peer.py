"""Our llama.cpp-style draft trees beside llama.cpp's own llama-speculative (examples/speculative), one
sequence, greedy, the same files, prompts and tree settings:

    python bench/peerkit/tree_peer.py -m TARGET.gguf -md DRAFT.gguf [-np 4] [--p-split 0.1] [--budget 8] [-n 64]

Theirs: llama-speculative -m T -md D -np B --draft-p-split P --spec-draft-n-max N --temp 0.
Ours:   generate(spec=True, draft_shape="tree:branches=B,p_split=P,budget=N") at temperature 0, and
        the same with p_split=1 (never split), the tree llama-speculative actually drafts at
        --temp 0 (below), for as many tokens as theirs emitted: then the rounds and accepted counts
        are the same, and only the last round's levels differ (ours drafts no deeper than the tokens
        left).

Writes bench/results/trees/peer-<target>.json (--out elsewhere) and prints a table.

What the two count: llama-speculative's n_drafted counts draft decode steps (one per level of
the tree, whatever the number of branches), n_accept the accepted tokens, n_predict every emitted
token; it stops after the round that passes -n, so it may emit a few more tokens, and its first
token (from the prompt's logits) is a round of its own without a draft (left out of its rounds
here). Texts are compared without leading or trailing white space (the first token's
detokenization differs by a space). Ours counts
drafted nodes, accepted tokens and rounds, and stops at -n exactly. So the table puts the
per-round quantities side by side: levels drafted per round, accepted per round, and the texts
over their common length.

Why their trees are chains at --temp 0: their draft sampler's candidate probabilities come from
the sampling chain, whose greedy temperature sets every candidate but the top one to -inf, so the
split test p > p_split never passes (every candidate after the first has p = 0). Ours ranks
candidates by the draft's softmax at temperature 1, so at the same p_split it does split.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peerkit.common import RESULTS, log, rel, run_tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = {
    "story": "Once upon a time there was a",
    "facts": "The capital of France is Paris. The capital of Germany is",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
}


def find_tool(build: Path | None) -> Path:
    """llama-speculative from --build, else from the project's build dirs (SPECNATIVE_PEER_TOOLS=ON)."""
    candidates = [build / "bin" / "llama-speculative"] if build else sorted(ROOT.glob("build/*/bin/llama-speculative"))
    for path in candidates:
        if path.exists():
            return path
    raise SystemExit("error: llama-speculative not found: build with SPECNATIVE_PEER_TOOLS=ON (it lands in "
                     "build/<tag>/bin) or pass --build DIR")


def theirs(tool, target, draft, prompt, n, branches, p_split, budget, threads) -> dict:
    cmd = [str(tool), "-m", str(target), "-md", str(draft), "-p", prompt, "-n", str(n), "--temp", "0",
           "-np", str(branches), "--draft-p-split", str(p_split), "--spec-draft-n-max", str(budget),
           "-t", str(threads), "-c", "4096", "--swa-full", "-fa", "off", "--seed", "1"]  # ours runs without flash attention
    for attempt in range(1, 21):  # now and then (often, here) it ends without its closing statistics (exit 0): retried
        p = run_tool(cmd)
        both = p.stdout + "\n" + p.stderr
        if re.search(r"n_accept\s*=", both):
            break
        log(f"  llama-speculative ended without its statistics (attempt {attempt}); retrying")

    def grab(name):
        m = re.search(rf"{name}\s*=\s*(\d+)", both)
        if not m:
            raise RuntimeError(f"llama-speculative output lacks {name}:\n{both[-2000:]}")
        return int(m.group(1))

    emitted, levels, accepted = grab("n_predict"), grab("n_drafted"), grab("n_accept")
    i = p.stdout.find(prompt)
    text = p.stdout[i + len(prompt):] if i >= 0 else p.stdout
    # each round emits its accepted tokens and one target token; its first token (from the prompt's
    # logits) is a round of its own without a draft: left out, as ours takes it from the prefill
    rounds = emitted - accepted - 1
    return {"emitted": emitted, "levels": levels, "accepted": accepted, "rounds": rounds,
            "levels_per_round": levels / rounds if rounds else float("nan"),
            "accepted_per_round": accepted / rounds if rounds else float("nan"), "text": text.strip()}


def ours(engine, prompt, n, shape) -> dict:
    r = engine.generate(prompt, n_predict=n, spec=True, draft_shape=shape, stop_at_eos=True)
    t = r.totals
    levels = int(sum(t["drafted_at"]))  # rounds that drafted depth d, summed: draft levels
    rounds = int(t["rounds"])
    return {"emitted": int(t["emitted"]) + 1, "nodes": int(t["drafted"]), "levels": levels,
            "accepted": int(t["accepted"]), "rounds": rounds,
            "levels_per_round": levels / rounds if rounds else float("nan"),
            "nodes_per_round": int(t["drafted"]) / rounds if rounds else float("nan"),
            "accepted_per_round": int(t["accepted"]) / rounds if rounds else float("nan"),
            "text": r.texts[0].strip()}


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv=None) -> int:
    from specnative import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--target", type=Path, required=True)
    ap.add_argument("-md", "--draft", type=Path, required=True)
    ap.add_argument("-np", "--branches", type=int, default=4)
    ap.add_argument("--p-split", type=float, default=0.1)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--build", type=Path, default=None, help="a llama.cpp build dir with bin/llama-speculative")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    tool = find_tool(a.build)
    for path in (a.target, a.draft):
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file")
    shape = f"tree:branches={a.branches},p_split={a.p_split:g},budget={a.budget}"
    unsplit = f"tree:branches={a.branches},p_split=1,budget={a.budget}"
    rows = []
    with Engine(a.target, a.draft, n_ctx=4096, n_threads=a.threads, n_seq_max=a.branches) as engine:
        for name, prompt in PROMPTS.items():
            log(f"{name}")
            theirs_run = theirs(tool, a.target, a.draft, prompt, a.n, a.branches, a.p_split, a.budget, a.threads)
            # as many tokens as theirs emitted: the same rounds, the last one drafted only as deep as needed
            same = ours(engine, prompt, theirs_run["emitted"], unsplit)
            split = ours(engine, prompt, a.n, shape)
            for run in (same, split):
                run["text_agrees_chars"] = common_prefix(run["text"], theirs_run["text"])
                run["text_agrees_fully"] = run["text_agrees_chars"] >= min(len(run["text"]), len(theirs_run["text"]))
            rows.append({"prompt": name, "theirs": theirs_run, "ours_unsplit": same, "ours": split})
    out = a.out or ROOT / "bench" / "results" / "trees" / f"peer-{a.target.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"target": a.target.name, "draft": a.draft.name, "branches": a.branches, "p_split": a.p_split,
              "budget": a.budget, "n_predict": a.n, "threads": a.threads, "tool": rel(tool),
              "ours_shape": shape, "ours_unsplit_shape": unsplit, "rows": rows}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"| prompt | side | emitted | rounds | levels/round | nodes/round | accepted/round | text agrees |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for side in ("theirs", "ours_unsplit", "ours"):
            x = r[side]
            agree = "" if side == "theirs" else ("all" if x["text_agrees_fully"] else f"{x['text_agrees_chars']} chars")
            print(f"| {r['prompt']} | {side} | {x['emitted']} | {x['rounds']} | {x['levels_per_round']:.2f} | "
                  f"{x.get('nodes_per_round', x['levels_per_round']):.2f} | {x['accepted_per_round']:.2f} | {agree} |")
    log(f"wrote {rel(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
