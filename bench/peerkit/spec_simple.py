"""llama-speculative-simple: llama.cpp's one-sequence speculative loop, the peer of our spec-on
runs at concurrency 1. It prints its totals; a debug run (-lv 5) shows where drafts were rejected."""
from __future__ import annotations

import re

from .common import log, ngl_arg, run_tool

NAME = "llama-speculative-simple"


def spec_cmd(tools, target, draft, prompt, n, k, a, swa_full):
    cmd = [str(tools[NAME]), "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(a.threads),
           "-fa", a.flash_attn, "-c", str(a.ctx), "-ngl", ngl_arg(a.ngl), "-ngld", ngl_arg(a.ngl)]
    if swa_full:
        cmd.append("--swa-full")  # ours keeps swa_full=true for rollback; the same cache for both
    return cmd


def parse_spec_output(out: str, err: str, prompt: str) -> dict:
    both = out + "\n" + err

    def grab(pattern):
        m = re.search(pattern, both)
        if not m:
            raise RuntimeError(f"llama-speculative-simple output lacks /{pattern}/:\n{both[-3000:]}")
        return m.groups()

    n_dec, secs, speed = grab(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
    n_dec, secs, speed = int(n_dec), float(secs), float(speed)
    drafted = int(grab(r"n_drafted\s*=\s*(\d+)")[0])
    accepted = int(grab(r"n_accept\s*=\s*(\d+)")[0])
    i = out.find(prompt)
    rounds = n_dec - accepted  # each round emits its accepted drafts plus one target token
    return {"tps": speed, "tokens": n_dec, "seconds": secs, "alpha": accepted / drafted if drafted else float("nan"),
            "drafted": drafted, "accepted": accepted, "rounds": rounds,
            "n_prompt": int(grab(r"encoded\s+(\d+) tokens")[0]),
            "round_ms": secs * 1000.0 / rounds if rounds else float("nan"),
            "text": out[i + len(prompt):] if i >= 0 else out}


def theirs_spec(cmd, prompt, attempts=3):
    """One timed llama-speculative-simple run. Now and then (about 1 run in 10 here) it ends
    without its closing statistics (exit code logged); such a run is retried, not counted."""
    for attempt in range(1, attempts + 1):
        p = run_tool(cmd)
        try:
            return parse_spec_output(p.stdout, p.stderr, prompt)
        except RuntimeError:
            if attempt == attempts:
                raise
            log(f"  llama-speculative-simple ended without its statistics (exit {p.returncode}); retrying")


def theirs_debug(cmd, prompt) -> dict:
    """An extra, untimed run of speculative-simple with debug logging (-lv 5): per round how many
    drafts it accepted and, at each rejection, the index of the generated token there (0 = the
    first token after the prompt) and its draft's top candidates with their probabilities."""
    p = run_tool(cmd + ["-lv", "5"])
    res = parse_spec_output(p.stdout, p.stderr, prompt)
    cand = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([\d.]+)\) '(.*)'$")
    done = re.compile(r"accepted (\d+)/(\d+) draft tokens")
    rounds, current = [], {}
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        m = cand.search(line)
        if m:
            rank, pos = int(m.group(1)), int(m.group(2))
            current.setdefault(pos, []).append((rank, m.group(5), float(m.group(4))))
            continue
        m = done.search(line)
        if m:
            rounds.append((int(m.group(1)), int(m.group(2)), current))
            current = {}
    misses, emitted = [], 0
    for i, (acc, n, cands) in enumerate(rounds):
        if acc < n:
            top = sorted(cands.get(acc, []))[:3]
            misses.append({"round": i + 1, "position": acc + 1, "drafted": n, "index": emitted + acc,
                           "top": [(piece, prob) for _, piece, prob in top]})
        emitted += acc + 1
    hist = [0] * (max((n for _, n, _ in rounds), default=0) + 1)
    for acc, _, _ in rounds:
        hist[acc] += 1
    res.update({"misses": misses, "hist": hist, "n_rounds_logged": len(rounds)})
    return res


def aligned_prompt(engine, prompt: str, first_token: int):
    """The prompt text extended by our first generated token, if it tokenizes back to exactly
    prompt tokens + that token. speculative-simple drafts from the last prompt token (its first
    round yields the first generated token), we draft from the first generated token (prefill
    samples it): with this prompt its rounds start where ours do."""
    tokens = [int(t) for t in engine.tokenize(prompt)]
    full, base = engine.detokenize(tokens + [first_token]), engine.detokenize(tokens)
    if not full.startswith(base):
        return None
    text = prompt + full[len(base):]
    again = [int(t) for t in engine.tokenize(text)]
    return text if again == tokens + [first_token] else None
