"""Self-distillation data: the target's own greedy continuations and the features a head reads.

EAGLE trains its head on what the target itself says, so every prompt is continued by the target,
greedily: by the torch re-implementation (default; torch_generate.py, many sequences per step,
features and logits from the same pass) or by llama.cpp through specnative's engine (its exact
tokens; then the torch target computes the features in a second pass). The continuation's tokens
are the hard labels, what a verify at temperature 0 accepts; the target's top-k next-token logits
at every position are the soft labels. The features, the inputs of the three target layers at
every position, always come from the torch target, which is checked here against llama.cpp on
sequences llama.cpp generated itself: greedy agreement with the engine's own tokens and the
largest logit difference at a few cut points (engine.prompt_logits).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from .deps import engine_class
from .deps import torch as _torch
from .gguf_target import TorchLlama
from .torch_generate import generate_batch, top_logits

GENERATORS = ("torch", "llama.cpp")


@dataclass
class Sequence:
    ident: str
    tokens: np.ndarray   # int64: prompt then the target's greedy continuation
    n_prompt: int
    soft_ids: np.ndarray | None = None  # [L, top_k] int64: the target's most likely next tokens per position
    soft_logits: np.ndarray | None = None  # [L, top_k] float32: their logits


@dataclass
class Distilled:
    sequences: list
    features: list = field(default_factory=list)  # per sequence: float32 tensor [L, 3 * n_embd]
    record: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(sum(len(s.tokens) for s in self.sequences))


def tokens_sha256(sequences) -> str:
    digest = hashlib.sha256()
    for s in sequences:
        digest.update(np.int64(s.n_prompt).tobytes())
        digest.update(np.asarray(s.tokens, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _progress(total, desc, unit, quiet):

    return tqdm(total=total, desc=desc, unit=unit, disable=quiet, dynamic_ncols=True, leave=True)


def _stop_ids(target) -> set:
    """End-of-generation ids of the target (eos, and eot where the file names one)."""
    import gguf

    reader = gguf.GGUFReader(str(target))
    ids = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        field = reader.get_field(key)
        if field is not None:
            ids.add(int(field.contents()))
    return ids


def generate(engine, model: TorchLlama, prompts, *, layers, n_predict: int, batch: int, deadline: float | None,
             generator: str, stop_ids=(), top_k: int = 0, quiet: bool = False) -> tuple[list[Sequence], list]:
    """Greedy continuations of the prompts, `batch` sequences at a time (llama.cpp through the
    engine, or torch), with every sequence's features (and top_k soft labels); no new batch starts
    after `deadline` (time.perf_counter())."""
    sequences, features = [], []
    per_prompt = 0.0  # seconds per prompt of the last batch: a batch that would end past the deadline is not started
    with _progress(len(prompts), f"continuations ({generator}) + features", "prompt", quiet) as bar:
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            began = time.perf_counter()
            if deadline is not None and sequences and began + per_prompt * len(chunk) > deadline:
                break
            if generator == "torch":
                done = generate_batch(model, [list(p.tokens) for p in chunk], n_predict=n_predict, layers=layers,
                                      stop_ids=stop_ids, top_k=top_k)
            else:
                result = engine.generate([list(p.tokens) for p in chunk], n_predict=n_predict, temperature=0.0)
                done = []
                for p, out in zip(chunk, result.tokens):
                    feats, logits = model.forward(np.concatenate([p.tokens, out]), layers, logits=top_k > 0)
                    done.append((np.asarray(out), feats, *(top_logits(logits, top_k) if top_k else (None, None))))
            for p, (out, feats, ids, values) in zip(chunk, done):
                tokens = np.concatenate([np.asarray(p.tokens, dtype=np.int64), np.asarray(out, dtype=np.int64)])
                sequences.append(Sequence(p.ident, tokens, len(p.tokens), ids, values))
                features.append(feats.contiguous())
            per_prompt = (time.perf_counter() - began) / len(chunk)
            bar.update(len(chunk))
            bar.set_postfix(tokens=sum(len(x.tokens) for x in sequences))
    return sequences, features


def read_replies(model: TorchLlama, prompts, *, layers, top_k: int, deadline: float | None, skip=frozenset(),
                 quiet: bool = False) -> tuple[list[Sequence], list]:
    """The target reading recorded replies (prompt + reply in one prefill pass, ~2.3x the tokens per
    second of decoding on CPU): features and soft labels at every position, in the order given, the
    prompts in `skip` (idents already continued) left out; none started after `deadline`. A read
    sequence is all "prompt" (n_prompt = its length): its tokens are not the target's own, so only
    its soft labels are taught and nothing of it is scored."""
    todo = [p for p in prompts if p.reply and p.ident not in skip]
    sequences, features = [], []
    with _progress(len(todo), "recorded replies read", "reply", quiet) as bar:
        for p in todo:
            if deadline is not None and time.perf_counter() > deadline:
                break
            tokens = np.asarray(p.tokens + p.reply, dtype=np.int64)
            feats, logits = model.forward(tokens, layers, logits=top_k > 0)
            ids, values = top_logits(logits, top_k) if top_k else (None, None)
            sequences.append(Sequence("read:" + p.ident, tokens, len(tokens), ids, values))
            features.append(feats.contiguous())
            bar.update(1)
    return sequences, features


def check_against_llama(engine, model: TorchLlama, sequences) -> dict:
    """How far the torch target is from llama.cpp on these sequences: its greedy choice against
    the tokens llama.cpp generated, and max |logit difference| at the prompt's end, the middle and
    the end of each continuation."""
    agree = total = 0
    deltas = []
    for s in sequences:
        _, logits = model.forward(s.tokens, (), logits=True)
        picks = logits.argmax(-1).numpy()
        n, length = s.n_prompt, len(s.tokens)
        agree += int((picks[n - 1:length - 1] == s.tokens[n:]).sum())
        total += length - n
        for cut in sorted({n, (n + length) // 2, length}):
            reference = np.asarray(engine.prompt_logits(s.tokens[:cut].tolist()), dtype=np.float32)
            deltas.append(float(np.abs(reference - logits[cut - 1].numpy()).max()))
    return {"sequences": len(sequences), "continuation_tokens": total,
            "greedy_agreement": agree / total if total else float("nan"),
            "max_abs_dlogit": max(deltas) if deltas else float("nan"),
            "median_max_abs_dlogit": float(np.median(deltas)) if deltas else float("nan"),
            "cut_points": len(deltas),
            "what": "torch float32 graph on dequantized weights vs llama.cpp's logits (engine.prompt_logits) "
                    "on the same tokens; agreement: torch argmax == the token llama.cpp generated"}


def distill(target, prompts, *, layers, n_predict: int, threads: int, generator: str = "torch", n_seq: int = 8,
            torch_batch: int = 32, n_check: int = 4, deadline: float | None = None, top_k: int = 0,
            read_deadline: float | None = None, read: bool = False, quiet: bool = False) -> Distilled:
    """Continuations (by torch or llama.cpp), features by the torch target, and the check of the
    torch target against llama.cpp (on sequences llama.cpp generated itself). With a deadline, the
    prompts not reached by then are left out (and counted). read: then the recorded replies of
    the prompts not continued, from the end of the order, until read_deadline (read_replies;
    without a deadline, every reply); the read sequences come after the continued ones."""
    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {GENERATORS}, not {generator!r}")
    torch = _torch()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    longest = max(len(p.tokens) for p in prompts) + n_predict
    Engine = engine_class()
    model = TorchLlama(target)
    with Engine(target, n_ctx=n_seq * longest + 256, n_batch=512, n_seq_max=n_seq, n_threads=threads) as engine:
        sequences, features = generate(engine, model, prompts, layers=layers, n_predict=n_predict,
                                       batch=torch_batch if generator == "torch" else n_seq, deadline=deadline,
                                       generator=generator, stop_ids=_stop_ids(target), top_k=top_k, quiet=quiet)
        # llama.cpp's own continuations of a few prompts, for the check
        probe = prompts[:n_check]
        result = engine.generate([list(p.tokens) for p in probe], n_predict=n_predict, temperature=0.0)
        check = check_against_llama(engine, model, [
            Sequence(p.ident, np.concatenate([np.asarray(p.tokens), np.asarray(o)]).astype(np.int64), len(p.tokens))
            for p, o in zip(probe, result.tokens) if len(o)])
    n_continued = len(sequences)
    if read:  # within a time budget, the prompts not continued; without one, every reply too
        continued = {s.ident for s in sequences} if read_deadline is not None else frozenset()
        read_seqs, read_feats = read_replies(model, prompts[::-1], layers=layers, top_k=top_k, deadline=read_deadline,
                                             skip=continued, quiet=quiet)
        sequences, features = sequences + read_seqs, features + read_feats
    record = {"sequences": len(sequences), "continued": n_continued, "prompts_offered": len(prompts),
              "stopped_by_budget": n_continued < len(prompts),
              "tokens": int(sum(len(s.tokens) for s in sequences)),
              "continuation_tokens": int(sum(len(s.tokens) - s.n_prompt for s in sequences)),
              "read": {"replies": len(sequences) - n_continued,
                       "tokens": int(sum(len(s.tokens) for s in sequences[n_continued:])),
                       "what": "prompt + recorded reply (ShareGPT's assistant turn, at most n_predict tokens) "
                               "read by the torch target in one pass: features and soft labels only"} if read else None,
              "n_predict": n_predict, "tokens_sha256": tokens_sha256(sequences),
              "seconds": round(time.perf_counter() - started, 1),
              "generator": generator,
              "labels": ("the target's greedy continuation by the torch target (float32, many sequences per step)"
                         if generator == "torch" else
                         "the target's greedy continuation by llama.cpp (specnative Engine.generate, T = 0)")
                        + (f"; soft: the torch target's top {top_k} next-token logits at every position"
                           if top_k > 0 else ""),
              "features_from": "torch re-implementation of the target graph (float32, dequantized GGUF weights)",
              "torch_vs_llama_cpp": check}
    return Distilled(sequences, features, record)
