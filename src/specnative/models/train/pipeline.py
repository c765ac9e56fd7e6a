"""train-drafter from end to end: check the target, self-distill, train, write, report.

Order matters for the user's time: the target is judged from its metadata, torch and the data
spec are checked, and only then is anything generated or trained. The report (`OUT.train.json`)
holds the settings, what the data was (by hash), the torch target's measured distance to
llama.cpp, the loss curve, the held-out agreement by draft position before and after training,
and where the time went.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import deps
from .batches import choose_draft_vocab, coverage, t2d_table
from .dflash_pipeline import setup_dflash
from .distill import distill
from .gguf_target import load_weights
from .head import HeadConfig, make_head
from .layers import from_target
from .loop import train
from .measure import speculative, teacher_forced
from .prompts import check_spec, load_prompts, split_spec
from .target_check import check_target, read_target
from .trainer import TrainSettings
from .writer import write_drafter

# The target's tensors a new head starts from (output.weight is absent where it is tied).
HEAD_INIT_TENSORS = {"token_embd.weight", "output.weight", "output_norm.weight"}
# Share of a time budget kept for the final held-out measurement and writing the file.
RESERVE_SHARE, RESERVE_MIN_S = 0.015, 5.0
# The least time budget: the reserve and a second to distill and train in. Below it the deadline
# falls before the target is even read, and the first batch of data and of training (which always
# run) overrun the budget many times over.
MIN_BUDGET_MINUTES = (RESERVE_MIN_S + 1.0) / 60.0


@dataclass
class Options:
    target: str
    out: str
    kind: str = "eagle3"
    data: str = "builtin"
    n_predict: int = 128
    budget_minutes: float | None = None
    max_tokens: int | None = None
    epochs: int | None = None
    seed: int = 0
    threads: int = 1
    draft_vocab: int = 8192
    layers: tuple | None = None
    n_embd: int | None = None
    held_out: float = 0.1
    max_prompt_tokens: int = 384
    data_share: float = 0.5
    read_share: float = 0.0   # of the data time: reading recorded replies instead of continuing prompts
    soft_top_k: int = 16
    generator: str = "torch"
    ttt_steps: int = 3
    lr: float = 3e-3
    batch_rows: int = TrainSettings.rows_per_batch
    n_seq: int = 8
    quiet: bool = False
    eval_data: str | None = None   # after writing: specnative's alpha on these prompts (not trained on)
    eval_k: int = 4
    block_size: int = 16          # dflash: the trained block (drafts of at most block_size - 1 tokens)
    draft_layers: int = 1         # dflash: the drafter's decoder layers
    gamma: float = 7.0            # dflash: loss decay over block offsets, exp(-(i - 1) / gamma)


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def held_out_split(n: int, share: float, seed: int) -> tuple[list, list]:
    """(train, held-out) sequence indices: a seeded share held out, at least one of each if n >= 2."""
    order = np.random.RandomState(seed & 0xFFFFFFFF).permutation(n)
    n_held = min(max(round(n * share), 1 if n >= 2 and share > 0 else 0), n - 1)
    return sorted(order[n_held:].tolist()), sorted(order[:n_held].tolist())


def new_head(info, weights: dict, d2t, layers, seed: int):
    """The seeded, untrained head for a target: its width and attention shape, the target's output
    rows of the draft vocabulary (d2t; None: all) and final norm, its token embeddings borrowed
    (`weights`: the target's HEAD_INIT_TENSORS as float32 arrays, load_weights)."""
    tok_embd, output, output_norm = from_target(weights, d2t)
    cfg = HeadConfig(n_embd=info.n_embd, n_embd_target=info.n_embd, n_head=info.n_head, n_head_kv=info.n_head_kv,
                     n_ff=info.n_ff, n_draft_vocab=info.n_vocab if d2t is None else len(d2t),
                     rope_base=info.rope_base, rms_eps=info.rms_eps)
    return make_head(cfg, tok_embd, output, seed, output_norm=output_norm, lens_slice=layers.index(max(layers)))


def setup_eagle3(o: Options, *, info, layers, weights, d2t, row_len: int, deadline, **_):
    """(the seeded head, its training recipe, the report's extras) of --kind eagle3."""
    head = new_head(info, weights, d2t, layers, o.seed)
    recipe = TrainSettings(seed=o.seed, steps=o.ttt_steps, lr=o.lr, row_len=row_len, max_tokens=o.max_tokens,
                           deadline=deadline, epochs=o.epochs, rows_per_batch=o.batch_rows, quiet=o.quiet)
    extra = {"ttt_steps": o.ttt_steps, "step_weights": f"0.8^j, j = 0..{o.ttt_steps - 1}",
             "rows_per_batch": recipe.rows_per_batch}
    return head, recipe, extra


# per kind: (options, target, data, ...) -> (the seeded head, its training recipe, the report's extras)
KINDS = {"eagle3": setup_eagle3, "dflash": setup_dflash}


def check_options(o: Options) -> None:
    """Refusals that need no data: ValueError (TargetError for the target) with one clear line."""
    if o.kind not in KINDS:
        raise ValueError(f"--kind {o.kind}: only {', '.join(KINDS)} heads can be trained")
    if o.budget_minutes is None and o.max_tokens is None and o.epochs is None:
        raise ValueError("give a budget: --budget-minutes, --max-tokens or --epochs")
    if o.budget_minutes is not None and not 0 < o.budget_minutes < math.inf:  # NaN passes a "<= 0" test
        raise ValueError(f"--budget-minutes must be a finite number > 0, not {o.budget_minutes:g}")
    if o.budget_minutes is not None and o.budget_minutes < MIN_BUDGET_MINUTES:
        raise ValueError(f"--budget-minutes {o.budget_minutes:g} ({o.budget_minutes * 60:.2g} s) leaves no time to "
                         f"distill or train: {RESERVE_MIN_S:g} s of a budget are kept for the final held-out "
                         f"measurement and writing the head; give at least {MIN_BUDGET_MINUTES:g}")
    if o.max_tokens is not None and o.max_tokens < 0:  # 0: the initialization written untrained, a baseline
        raise ValueError(f"--max-tokens must be >= 0 (0 writes the untrained initialization), not {o.max_tokens}")
    for flag, value in (("--epochs", o.epochs), ("-t/--threads", o.threads),
                        ("--max-prompt-tokens", o.max_prompt_tokens), ("--n-embd", o.n_embd)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, not {value}")
    if o.seed < 0:
        raise ValueError(f"--seed must be >= 0, not {o.seed}")
    if not 0 <= o.held_out < 1:
        raise ValueError(f"--held-out is a share of the sequences: in [0, 1), not {o.held_out:g}")
    if not 0 < o.lr < math.inf:
        raise ValueError(f"--lr must be a finite number > 0, not {o.lr:g}")
    if not 0 < o.data_share < 1:
        raise ValueError("--data-share must be in (0, 1)")
    if not 0 <= o.read_share < 1:
        raise ValueError("--read-share must be in [0, 1)")
    if o.read_share > 0 and not any(part.partition(":")[0] == "sharegpt" for part in split_spec(o.data)):
        raise ValueError("--read-share reads recorded replies: only ShareGPT has them; add sharegpt to --data")
    if o.n_predict < 2:
        raise ValueError("--n-predict must be at least 2 (a head is taught the token after the next)")
    if o.draft_vocab < 1:
        raise ValueError("--draft-vocab must be at least 1")
    if o.eval_k < 1:
        raise ValueError("--eval-k must be at least 1")
    if o.soft_top_k < 0:
        raise ValueError("--soft-top-k must be >= 0 (0: hard labels only)")
    if o.batch_rows < 1:
        raise ValueError("--batch-rows must be at least 1")
    if not 1 <= o.ttt_steps <= 8:
        raise ValueError("--ttt-steps must be in 1..8")
    if o.kind == "dflash":
        check_dflash_options(o)
    check_out(o)


def check_dflash_options(o: Options) -> None:
    if not 2 <= o.block_size <= 64:
        raise ValueError(f"--block-size must be in 2..64, not {o.block_size}")
    if o.eval_data and o.eval_k > o.block_size - 1:  # --eval-k is only the --eval-data measurement's draft length
        raise ValueError(f"--eval-k {o.eval_k}: a block of {o.block_size} drafts at most {o.block_size - 1} tokens; "
                         f"give --eval-k {o.block_size - 1} or less")
    if o.draft_layers < 1:
        raise ValueError(f"--draft-layers must be at least 1, not {o.draft_layers}")
    if not 0 < o.gamma < math.inf:
        raise ValueError(f"--gamma must be a finite number > 0, not {o.gamma:g}")


def check_out(o: Options) -> None:
    """-o names a file this command can write (and OUT.train.json beside it), before any work."""
    out = Path(o.out)
    if out.resolve() == Path(o.target).resolve():
        raise ValueError("-o would overwrite the target")
    if out.is_dir():
        raise ValueError(f"-o {out}: a folder; give the head's file name, e.g. {out / 'head.gguf'}")
    folder = out.resolve().parent
    if not folder.is_dir():
        raise ValueError(f"-o {out}: no folder {out.parent} to write it in")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"-o {out}: the folder {out.parent} is not writable")
    for path in (out, Path(str(out) + ".train.json")):
        if path.is_dir() or (path.exists() and not os.access(path, os.W_OK)):
            raise ValueError(f"-o {out}: {path} cannot be written")


def train_drafter(o: Options) -> dict:
    """Train and write the head described by `o`; returns the report (also written as JSON)."""
    started = time.perf_counter()
    check_options(o)
    info, layers = check_target(o.target, n_embd=o.n_embd, layers=o.layers)
    torch = deps.torch()
    check_spec(o.data)
    if o.eval_data:
        check_spec(o.eval_data)
    torch.set_num_threads(o.threads)
    deadline = continue_deadline = read_deadline = None
    if o.budget_minutes is not None:
        budget_s = o.budget_minutes * 60.0
        deadline = started + budget_s - max(RESERVE_MIN_S, RESERVE_SHARE * budget_s)
        read_deadline = started + o.data_share * budget_s
        continue_deadline = started + (1 - o.read_share) * o.data_share * budget_s

    # the head is never trained on the prompts it is measured on afterwards
    evaluation = load_prompts(o.eval_data, o.target, n_predict=o.n_predict,
                              max_prompt_tokens=o.max_prompt_tokens) if o.eval_data else ([], {})
    prompts, prompt_record = load_prompts(o.data, o.target, n_predict=o.n_predict, max_prompt_tokens=o.max_prompt_tokens,
                                          replies=o.read_share > 0, exclude={p.tokens for p in evaluation[0]})
    # a seeded order: a time budget that cuts the data keeps a sample of every source
    prompts = [prompts[i] for i in np.random.RandomState(o.seed & 0xFFFFFFFF).permutation(len(prompts))]
    data = distill(o.target, prompts, layers=layers, n_predict=o.n_predict, threads=o.threads, generator=o.generator,
                   n_seq=o.n_seq, deadline=continue_deadline, top_k=o.soft_top_k, read=o.read_share > 0,
                   read_deadline=read_deadline, quiet=o.quiet)
    data_s = time.perf_counter() - started
    # held out: continued sequences only (a read reply's tokens are not the target's own)
    n_continued = data.record["continued"]
    train_idx, held_idx = held_out_split(n_continued, o.held_out, o.seed)
    train_idx += list(range(n_continued, len(data.sequences)))
    pick = lambda idx: ([data.sequences[i] for i in idx], [data.features[i] for i in idx])
    train_set, held_set = pick(train_idx), pick(held_idx)

    d2t = choose_draft_vocab(train_set[0], info.n_vocab, o.draft_vocab)
    t2d = t2d_table(d2t, info.n_vocab)
    reader, _ = read_target(o.target)
    weights = load_weights(reader, HEAD_INIT_TENSORS)
    row_len = max(512, max(len(s.tokens) for s in data.sequences))
    head, recipe, training_extra = KINDS[o.kind](o, info=info, layers=layers, reader=reader, weights=weights,
                                                 d2t=d2t, train_set=train_set, held_set=held_set, row_len=row_len,
                                                 deadline=deadline)
    before = recipe.evaluate(head, *held_set, t2d) if held_idx else {}
    history = train(head, train_set, held_set, t2d, recipe)
    # the last epoch ended with this very measurement (training stops only at an epoch's end or budget)
    after = history["epochs"][-1].get("held_out", {}) if history["epochs"] else before
    out = write_drafter(o.out, head, d2t=d2t, target_reader=reader, target_info=info, layers=layers)
    cfg = head.cfg

    report = {
        "file": out.name, "sha256": _sha256(out), "kind": o.kind,
        "untrained": history["tokens"] == 0,  # --max-tokens 0: the seeded initialization, a baseline
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(o).items()},
        "target": {"file": Path(o.target).name, "sha256": _sha256(o.target), "arch": info.arch,
                   "n_layer": info.n_layer, "n_embd": info.n_embd, "n_vocab": info.n_vocab},
        "layers": list(layers), "head": cfg.as_dict(),
        "draft_vocab": {"size": cfg.n_draft_vocab, "rule": "the most frequent taught tokens of the training split "
                        "(ties by id)" if d2t is not None else "the whole target vocabulary",
                        "train_coverage": coverage(train_set[0], d2t), "held_out_coverage": coverage(held_set[0], d2t)},
        "prompts": prompt_record, "data": data.record,
        "split": {"train_sequences": len(train_idx), "of_them_read_replies": len(data.sequences) - n_continued,
                  "held_out_sequences": len(held_idx),
                  "held_out_ids": [data.sequences[i].ident for i in held_idx], "seed": o.seed},
        "training": {**history, **training_extra, "lr": o.lr, "row_len": row_len},
        "held_out": {"before_training": before, "after_training": after,
                     "what": "top1: the head's argmax equals the target's own next token, earlier tokens given "
                             "(teacher-forced); chained: draft positions 1..j all right from one anchor (what "
                             "greedy speculation accepts); anchors: every continuation position"},
        "time_s": {"data": round(data_s, 1), "train": history["train_s"],
                   "total": round(time.perf_counter() - started, 1)},
        "environment": {"torch": torch.__version__, "threads": o.threads, "python": platform.python_version()},
    }
    if o.eval_data:
        report["evaluation"] = evaluate_file(o, *evaluation, trained_prompts={p.tokens for p in prompts})
    Path(str(out) + ".train.json").write_text(json.dumps(report, indent=1))
    return report


def evaluate_file(o: Options, prompts, record: dict, trained_prompts=frozenset()) -> dict:
    """The written head on the prompts of o.eval_data (load_prompts: `prompts`, `record`) at T = 0,
    after training (outside its budget): specnative's counts and timers (llama.cpp's draft-eagle3),
    and the trainer's metric on the very tokens that run emitted, with the rounds simulated from it
    (see measure.py)."""
    started = time.perf_counter()
    measured, sequences = speculative(o.target, o.out, prompts, n_predict=o.n_predict, k=o.eval_k, threads=o.threads,
                                      n_seq=o.n_seq, drafter=o.kind)
    predicted = teacher_forced(o.target, o.out, sequences, k=o.eval_k, n_predict=o.n_predict, threads=o.threads)
    return {"data": o.eval_data, "prompts": record,
            "overlap_with_training": sum(p.tokens in trained_prompts for p in prompts),
            "specnative": measured, "trainer_metric_on_the_same_tokens": predicted,
            "seconds": round(time.perf_counter() - started, 1)}


def summary(report: dict) -> str:
    """A few lines for the terminal."""
    held = report["held_out"]["after_training"]
    check = report["data"]["torch_vs_llama_cpp"]
    vocab, data, training = report["draft_vocab"], report["data"], report["training"]
    read = f", {data['read']['replies']} recorded replies read" if data.get("read") else ""
    untrained = (" UNTRAINED: no training step ran (--max-tokens 0 writes the seeded initialization, a baseline "
                 "to measure trained heads against)") if report.get("untrained") else ""
    lines = [
        (f"wrote {report['file']} ({report['kind']}, layers {report['layers']}, draft vocabulary {vocab['size']}, "
         f"held-out coverage {vocab['held_out_coverage']:.3f}){untrained}"),
        (f"data: {data['sequences']} sequences, {data['continuation_tokens']} continuation tokens{read}; torch "
         f"target vs llama.cpp: greedy agreement {check['greedy_agreement']:.4f}, max |dlogit| "
         f"{check['max_abs_dlogit']:.3f}"),
        (f"training: {training['tokens']} tokens in {training['train_s']} s, {len(training['epochs'])} epoch(s); "
         f"total {report['time_s']['total']} s"),
    ]
    if held:
        lines.append(f"held-out top-1 by draft position {held['top1_by_position']}, "
                     f"chained {held['chained_by_position']}")
    if "evaluation" in report:
        ev = report["evaluation"]
        spec, sim = ev["specnative"], ev["trainer_metric_on_the_same_tokens"]
        lines.append(f"specnative on {ev['data']} (T = 0, k = {spec['k']}): alpha {spec['alpha']:.4f}, by position "
                     f"{spec['alpha_by_position']}, tau {spec['tau']:.3f}; the torch head predicts "
                     f"{sim['rounds']['alpha_by_position']} on the same tokens (teacher-forced top-1 "
                     f"{sim['top1_by_position']})")
    return "\n".join(lines)
