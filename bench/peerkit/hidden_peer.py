"""llama.cpp's hidden-state drafters in its own llama-speculative-simple beside ours, one sequence,
greedy, on the project's tiny files (src/specnative/models/tiny_drafters.py) or your own:

    python bench/peerkit/hidden_peer.py [--drafter dflash,dspark,eagle3,mtp] [-k 4] [-n 64] \
        [--acceptance low,mid,high] [--build DIR] [--server]   # writes bench/results/hidden-state-drafters/peer.json

    python bench/peerkit/hidden_peer.py --drafter dflash -m TARGET.gguf -md DFLASH.gguf

Theirs: llama-speculative-simple -m T [-md D] --spec-type draft-<drafter> --spec-draft-n-max k
--spec-draft-n-min 0 --spec-draft-p-min 0 --temp 0 (a build with SPECNATIVE_PEER_TOOLS=ON, or
bench/peers.py's build in bench/scratch/llama-build). Ours: Engine(T, D).generate(spec=True,
drafter=...). Printed per drafter and acceptance level: alpha ours / theirs (points apart),
drafted, accepted, and whether the emitted text agrees. Their loop keeps the last prompt token out
of its prefill and drafts once before the first generated token; ours prefills the whole prompt and
drafts from the first generated token on. So theirs gets the prompt extended by our first token
(spec_simple.aligned_prompt) and one token less to generate: both then draft from the same point;
and as theirs stops only once past -n, ours then generates as many tokens as it emitted. Both sides
run without flash attention (llama.cpp's tools default to -fa auto, which on a CPU turns it on:
other numerics, and a near-tie can go the other way).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peerkit.common import BUILD, RESULTS, log, rel, tool_path  # noqa: E402
from peerkit.spec_simple import aligned_prompt, theirs_spec  # noqa: E402

PROMPT = "The city of"
FILE_KIND = {"dflash": "dflash2", "dspark": "dspark", "eagle3": "eagle3", "mtp": "mtp"}  # tiny file per drafter


def theirs(tool, target, draft, drafter, prompt, n, k, threads) -> dict:
    cmd = [str(tool), "-m", str(target), "--spec-type", f"draft-{drafter}", "--spec-draft-n-max", str(k),
           "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-p", prompt, "-n", str(n), "--temp", "0",
           "-t", str(threads), "-c", "4096", "--swa-full", "-fa", "off"]  # ours runs without flash attention
    if draft is not None:
        cmd += ["-md", str(draft)]
    return {**theirs_spec(cmd, prompt), "command": " ".join(cmd)}


def server_side(build, target, draft, drafter, prompt_tokens, n, k, threads, log_dir: Path) -> dict:
    """llama-server with the same --spec-type, one greedy /completion of the same prompt tokens (our
    tokenization, BOS included, our first token appended as for speculative-simple); drafted and
    accepted from the answer's timings (draft_n, draft_n_accepted)."""
    from peerkit.server import HOST, LlamaServer

    cmd = [str(tool_path(build, "llama-server")), "-m", str(target), "--host", HOST, "-np", "1", "-c", "4096",
           "-t", str(threads), "-tb", str(threads), "--temp", "0", "--no-cache-prompt", "--cache-ram", "0",
           "--no-webui", "-fit", "off", "--swa-full", "-fa", "off", "--spec-type", f"draft-{drafter}",
           "--spec-draft-n-max", str(k),
           "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    if draft is not None:
        cmd += ["-md", str(draft)]
    with LlamaServer(cmd, log_dir / f"server-{drafter}.log", start_timeout=120, request_timeout=300) as server:
        answer = server.complete(prompt_tokens, n, ignore_eos=True)
    t = answer["timings"]
    drafted, accepted = int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
    return {"alpha": accepted / drafted if drafted else float("nan"), "drafted": drafted, "accepted": accepted,
            "tokens": int(t["predicted_n"]), "text": answer.get("content", ""), "command": " ".join(cmd)}


def ours(target, draft, drafter, prompt, n, k, threads) -> dict:
    """Our run, its counts and text after the first token, and the prompt their run gets."""
    from specnative import Engine

    with Engine(target, draft, n_ctx=4096, n_threads=threads, n_seq_max=1, mtp=drafter == "mtp") as engine:
        r = engine.generate(prompt, n_predict=n, spec=True, k=k, drafter=drafter, stop_at_eos=False)
        t = r.totals
        first = int(r.tokens[0][0])
        return {"alpha": r.draft_accept_rate, "drafted": int(t["drafted"]), "accepted": int(t["accepted"]),
                "rounds": int(t["rounds"]), "tps": r.tps, "text": engine.detokenize(r.tokens[0][1:]),
                "file_kind": engine.hidden_drafter, "their_prompt": aligned_prompt(engine, prompt, first),
                "their_tokens": [int(x) for x in engine.tokenize(prompt)] + [first]}


def pairs(a, workdir: Path):
    """(drafter, acceptance, target, draft) to compare: the given files, or the tiny ones."""
    if a.target:
        for drafter in a.drafter.split(","):
            yield drafter, "given", a.target, a.draft
        return
    from specnative.models.tiny_drafters import drafter_pair

    for drafter in a.drafter.split(","):
        for acceptance in a.acceptance.split(","):
            target, draft = drafter_pair(workdir, FILE_KIND[drafter], acceptance=acceptance)
            yield drafter, acceptance, target, draft


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", default="dflash,dspark,eagle3,mtp")
    ap.add_argument("--acceptance", default="low,mid,high", help="tiny files' acceptance levels")
    ap.add_argument("-m", "--target", type=Path, help="your target (with -md for dflash/dspark/eagle3)")
    ap.add_argument("-md", "--draft", type=Path)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--build", type=Path, default=BUILD, help="llama.cpp build dir with llama-speculative-simple")
    ap.add_argument("--server", action="store_true", help="also llama-server with the same --spec-type")
    ap.add_argument("--prompt", action="append", help=f"a prompt (repeatable; default {PROMPT!r})")
    ap.add_argument("--out", type=Path, default=RESULTS / "hidden-state-drafters" / "peer.json")
    a = ap.parse_args(argv)
    unknown = [d for d in a.drafter.split(",") if d not in FILE_KIND]
    if unknown:
        ap.error(f"--drafter: unknown {', '.join(unknown)} (any of {', '.join(FILE_KIND)})")
    tool = tool_path(a.build, "llama-speculative-simple")
    if not tool.exists():
        raise SystemExit(f"error: {rel(tool)} not found: build llama.cpp's tools (SPECNATIVE_PEER_TOOLS=ON, or "
                         f"python bench/peers.py, which builds them into bench/scratch/llama-build) or pass --build")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (drafter, acceptance, target, draft), prompt in itertools.product(list(pairs(a, Path(tmp))),
                                                                              a.prompt or [PROMPT]):
            log(f"{drafter} {acceptance} {prompt[:40]!r}")
            first = ours(target, draft, drafter, prompt, 1, a.k, a.threads)  # the first token only
            their_prompt, their_tokens = first["their_prompt"], first["their_tokens"]
            if their_prompt is None:
                log(f"  our first token does not re-tokenize after {prompt!r}; theirs starts one round earlier")
            t = theirs(tool, target, draft, drafter, their_prompt or prompt, a.n - 1 if their_prompt else a.n,
                       a.k, a.threads)
            # theirs may emit past -n (it stops once over it): ours generates as many tokens, so that
            # both end on the same round
            o = ours(target, draft, drafter, prompt, t["tokens"] + (1 if their_prompt else 0), a.k, a.threads)
            o.pop("their_prompt"), o.pop("their_tokens")
            row = {"drafter": drafter, "acceptance": acceptance, "prompt": prompt, "file_kind": o.pop("file_kind"),
                   "ours": o,
                   "theirs": {key: v for key, v in t.items()},
                   "alpha_points": 100 * (o["alpha"] - t["alpha"]),
                   "text_agrees": o["text"].strip() == t["text"].strip()[: len(o["text"].strip())]}
            if a.server:
                srv = server_side(a.build, target, draft, drafter, their_tokens, a.n - 1, a.k, a.threads, Path(tmp))
                # ours again, as many tokens as the server generated (it stops at n_predict exactly)
                o2 = ours(target, draft, drafter, prompt, srv["tokens"] + 1, a.k, a.threads)
                o2.pop("their_prompt"), o2.pop("their_tokens"), o2.pop("file_kind")
                row["server"], row["ours_at_server_length"] = srv, o2
                row["server_alpha_points"] = 100 * (o2["alpha"] - srv["alpha"])
                row["server_text_agrees"] = o2["text"].strip() == srv["text"].strip()
            rows.append(row)
            print(f"{drafter:7s} {acceptance:6s} alpha ours {o['alpha']:.3f} theirs {t['alpha']:.3f} "
                  f"({row['alpha_points']:+.1f} pts); drafted {o['drafted']}/{t['drafted']}, accepted "
                  f"{o['accepted']}/{t['accepted']}; text agrees: {row['text_agrees']}"
                  + (f"; server alpha {row['server']['alpha']:.3f} ({row['server_alpha_points']:+.1f} pts), drafted "
                     f"{row['ours_at_server_length']['drafted']}/{row['server']['drafted']}, accepted "
                     f"{row['ours_at_server_length']['accepted']}/{row['server']['accepted']}, text agrees: "
                     f"{row['server_text_agrees']}" if a.server else ""))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": " ".join(["python bench/peerkit/hidden_peer.py"] + (argv or sys.argv[1:])),
                                 "k": a.k, "n": a.n, "prompts": a.prompt or [PROMPT], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
