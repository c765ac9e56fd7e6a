"""The serving advice in the form each engine takes: vLLM's `--speculative-config` JSON and SGLang's
`--speculative-*` flags, beside the llama-server flags the advice already gives (crossover.advice).

Each form is derived from a llama.cpp measurement on the named host: the drafter and k that were
measured, and where speculation paid by batch size. It is a starting point for that engine, not a
measured fact about it (another engine's kernels, scheduler and drafter implementation move the
crossover). The mapping:

- vLLM: `method` from the drafter (draft model -> draft_model, llama.cpp's n-gram drafters ->
  ngram, eagle3, mtp, dflash), `num_speculative_tokens` = k, and where the advice's k per batch
  size is not the same at every size, `num_speculative_tokens_per_batch_size` as [[lo, hi, k],
  ...] ranges of batch sizes (0: no drafting) with `disable_by_batch_size` beside it. A draft
  tree gets no vLLM form (its chains only).
- SGLang: `--speculative-algorithm` from the drafter (STANDALONE, EAGLE3, NEXTN, NGRAM), and for a
  chain of k `--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens
  k+1`; for a top-k tree (topk, depth, budget) steps = depth, topk = topk, draft tokens = budget + 1
  (SGLang counts the verified root with the drafts). A split tree has no SGLang shape.
"""
from __future__ import annotations

import json

from specnative.engine import parse_draft_shape

VLLM_METHODS = {"model": "draft_model", "eagle3": "eagle3", "mtp": "mtp", "dflash": "dflash"}
SGLANG_ALGORITHMS = {"model": "STANDALONE", "eagle3": "EAGLE3", "mtp": "NEXTN"}
# where the engine reads the drafter's weights: a placeholder for the user's own path
DRAFT_PATHS = {"model": "DRAFT", "eagle3": "EAGLE3_HEAD", "dflash": "DFLASH_DRAFT"}


def _is_ngram(drafter: str) -> bool:
    return drafter.startswith("ngram")


def derived_from(host: str) -> str:
    return (f"derived from a llama.cpp measurement on {host}: a starting point for this engine, not a measured "
            f"fact about it")


def schedule(k_by_batch_size: dict) -> list[list[int]]:
    """{size: k} -> vLLM's [[lo, hi, k], ...]: consecutive sizes with the same k merged."""
    ranges: list[list[int]] = []
    for size, k in sorted((int(s), int(v)) for s, v in k_by_batch_size.items()):
        if ranges and ranges[-1][2] == k and ranges[-1][1] == size - 1:
            ranges[-1][1] = size
        else:
            ranges.append([size, size, k])
    return ranges


def _pays_somewhere(adv: dict) -> bool:
    return any(int(v) > 0 for v in (adv.get("k_by_batch_size") or {}).values())


def vllm_form(adv: dict, host: str, draft_shape: str | None = None) -> dict:
    drafter, k = str(adv.get("drafter") or "model"), adv.get("k")
    out = {"derived_from": derived_from(host)}
    method = "ngram" if _is_ngram(drafter) else VLLM_METHODS.get(drafter)
    if parse_draft_shape(draft_shape).is_tree:
        return {**out, "speculative_config": None, "flags": None,
                "note": f"the measured shape is a draft tree ({draft_shape}): no vLLM form is derived from it"}
    if method is None:
        return {**out, "speculative_config": None, "flags": None,
                "note": f"vLLM has no speculative method for the {drafter} drafter"}
    if k is None or not _pays_somewhere(adv):
        return {**out, "speculative_config": None, "flags": None,
                "note": "speculation paid at no measured batch size: leave --speculative-config unset, as the "
                        "llama-server flags leave the draft out"}
    cfg = {"method": method}
    if drafter in DRAFT_PATHS:
        cfg["model"] = DRAFT_PATHS[drafter]
    cfg["num_speculative_tokens"] = int(k)
    by_size = schedule(adv["k_by_batch_size"])
    if len({k for _, _, k in by_size}) > 1:
        cfg["num_speculative_tokens_per_batch_size"] = by_size
        if adv.get("disable_by_batch_size") is not None:
            cfg["disable_by_batch_size"] = int(adv["disable_by_batch_size"])
    note = (f"k per batch size up to the measured max concurrency ({adv.get('max_concurrency')}); larger batches "
            f"were not measured" if "num_speculative_tokens_per_batch_size" in cfg else
            "the measured k at every measured batch size")
    if _is_ngram(drafter):
        note += "; the n-gram sizes are vLLM's defaults (llama.cpp's n-gram options do not carry over)"
    if "model" in cfg:
        note += f"; replace {cfg['model']} with the drafter's Hugging Face repo or path"
    return {**out, "speculative_config": cfg, "flags": f"--speculative-config '{json.dumps(cfg)}'", "note": note}


def sglang_form(adv: dict, host: str, draft_shape: str | None = None) -> dict:
    drafter, k = str(adv.get("drafter") or "model"), adv.get("k")
    out = {"derived_from": derived_from(host)}
    algorithm = "NGRAM" if _is_ngram(drafter) else SGLANG_ALGORITHMS.get(drafter)
    shape = parse_draft_shape(draft_shape)
    if algorithm is None:
        return {**out, "flags": None, "note": f"SGLang has no speculative algorithm for the {drafter} drafter"}
    if shape.kind == "split":
        return {**out, "flags": None, "note": f"SGLang's trees are top-k trees: no form for {draft_shape}"}
    if k is None or not _pays_somewhere(adv):
        return {**out, "flags": None, "note": "speculation paid at no measured batch size: leave the "
                                              "--speculative-* flags out"}
    steps, topk, tokens = (shape.depth, shape.topk, shape.budget + 1) if shape.is_tree else (int(k), 1, int(k) + 1)
    flags = f"--speculative-algorithm {algorithm}"
    if drafter in DRAFT_PATHS:
        flags += f" --speculative-draft-model-path {DRAFT_PATHS[drafter]}"
    if algorithm == "NGRAM":
        flags += f" --speculative-num-draft-tokens {tokens}"
    else:
        flags += (f" --speculative-num-steps {steps} --speculative-eagle-topk {topk} "
                  f"--speculative-num-draft-tokens {tokens}")
    note = ("SGLang's flags hold one shape at every batch size: where the advice is off by load, serve those loads "
            "without them" if len({v for v in adv["k_by_batch_size"].values()}) > 1 else
            "the measured shape at every measured batch size")
    return {**out, "flags": flags, "note": note}


def engine_forms(adv: dict, host: str, draft_shape: str | None = None) -> dict:
    """{"vllm": ..., "sglang": ...} of one serving advice (crossover.advice's dict)."""
    return {"vllm": vllm_form(adv, host, draft_shape), "sglang": sglang_form(adv, host, draft_shape)}
