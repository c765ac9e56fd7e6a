"""specnative's side of every comparison: Engine runs reduced to plain dicts."""
from __future__ import annotations

import numpy as np


def ours_baseline(engine, prompt, n, stop_at_eos=False):
    before = engine.context_info()
    r = engine.generate(prompt, n_predict=n, stop_at_eos=stop_at_eos)
    after = engine.context_info()
    return {"tps": r.tps, "step_ms": r.step_ms, "tokens": r.decode_tokens, "steps": r.steps,
            "decode_ms": r.times["decode"], "token_ids": [[int(t) for t in s] for s in r.tokens],
            "texts": list(r.texts),
            # llama.cpp's own counters over this run: single-token decodes, and how many of them
            # reused the previous graph instead of building one (llama_perf_context)
            "single_decodes": after["n_eval"] - before["n_eval"],
            "graphs_reused": after["n_reused"] - before["n_reused"],
            "llama_ms": r.times["llama"], "engine_own_share": r.engine_own["engine_own_share"]}


def context_params(engine, draft=False) -> dict:
    """Our llama_context's parameters as llama.cpp set them (beside llama-bench's)."""
    i = engine.context_info(draft)
    return {k: i[k] for k in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "kv_unified", "swa_full", "n_threads")}


def ours_spec(engine, prompt, n, k, stop_at_eos=True):
    s = engine.generate(prompt, n_predict=n, spec=True, k=k, accept_rule="greedy", stop_at_eos=stop_at_eos)
    tot = s.totals
    drafted_at = np.asarray(tot["drafted_at"], dtype=float)
    accepted_at = np.asarray(tot["accepted_at"], dtype=float)
    # rounds that drafted at least one token: llama-server's "drafts" (verification steps) count
    rounds_drafting = float(drafted_at[0]) if drafted_at.size else 0.0
    return {"tps": s.tps, "alpha": s.draft_accept_rate, "tau": s.mean_accept_len, "round_ms": s.round_ms,
            "tokens": s.decode_tokens, "rounds": int(tot["rounds"]), "drafted": int(tot["drafted"]),
            "accepted": int(tot["accepted"]), "draft_ms": s.times["draft"], "verify_ms": s.times["verify"],
            "resample_ms": s.times["resample"], "text": s.texts[0], "texts": list(s.texts),
            "llama_ms": s.times["llama"], "engine_own_share": s.engine_own["engine_own_share"],
            "token_ids": [int(t) for t in s.tokens[0]],
            "all_token_ids": [[int(t) for t in seq] for seq in s.tokens],
            "per_pos": [round(float(x), 3) for x in s.per_position_accept_rate],
            # accepted at position i over rounds that drafted: llama-server's per-position rate
            "per_pos_of_rounds": [float(x) / rounds_drafting if rounds_drafting else float("nan")
                                  for x in accepted_at],
            "rounds_drafting": int(rounds_drafting),
            "hist": [int(x) for x in tot["accept_len_hist"]]}
