"""The traces.csv schema: defined here once, printed by `specnative schema`.

One row per measured cell and spec_decode value. The first nine columns are the required ones, in
its order; the rest only ever get appended (extend, never rename). Rows with spec_decode=off leave
the draft columns empty.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "int", "float", "str", "bool"
    doc: str
    infinite: bool = False  # float columns: +inf is a value, not damage (request_rate inf: all at t = 0)


COLUMNS: tuple[Column, ...] = (
    # --- the nine required columns, in their order ---------------------------------------------
    Column("quant_bits", "int", "bits per weight of the target's quantization (from its GGUF file type)"),
    Column("spec_decode", "str", "'on' (speculative) or 'off' (target alone)"),
    Column("draft_accept_rate", "float", "alpha = accepted / drafted over the timed repeats (on rows)"),
    Column("verify_cost_c", "float", "c = T_round / T_step - 1 from this cell's on and off runs, steady state, so that "
           "speedup = steady_tau / (1 + c) exactly (on rows)"),
    Column("concurrency", "int", "sequences decoded together"),
    Column("ctx_len", "int", "tokens of shared context (documents, a prefix common to all sequences) before "
           "each sequence's own prompt; 0: the prompt alone (prompt_tokens: the whole prompt)"),
    Column("tps", "float", "generated tokens per second of decoding, all sequences, prefill excluded, in the steady "
           "state (iterations with every sequence active), pooled over the timed repeats"),
    Column("lossless_ok", "bool", "spec output equals the baseline's (see lossless_method)"),
    Column("seed", "int", "sampling seed (position-keyed RNG)"),
    # --- extras -------------------------------------------------------------------------------
    Column("tps_baseline", "float", "the same cell's spec-off tps"),
    Column("speedup", "float", "tps / tps_baseline"),
    Column("k", "int", "draft length (on rows)"),
    Column("temperature", "float", "sampling temperature for target and draft"),
    Column("accept_rule", "str", "greedy, match or rejection (on rows); synthetic on synthetic acceptance rows, "
           "whose drafts no rule judges"),
    Column("n_predict", "int", "tokens generated per sequence"),
    Column("warmup", "int", "--warmup: most discarded warm-up runs (warmup_used: how many were)"),
    Column("repeats", "int", "--repeats: fewest timed runs (repeats_used: how many ran); rates are pooled over the "
           "runs that count (total tokens over total time), as tps says"),
    Column("tps_std", "float", "standard deviation of tps over the repeats"),
    Column("tps_min", "float", "lowest tps over the repeats"),
    Column("tps_max", "float", "highest tps over the repeats"),
    Column("token_accept_rate", "float", "accepted / (accepted + rounds ended by a rejection): Leviathan's "
           "per-token alpha, what the closed form assumes (on rows)"),
    Column("mean_accept_len", "float", "tau = emitted tokens / rounds, bonus token included (on rows)"),
    Column("predicted_speedup", "float", "(1 - a^(k+1)) / ((1 - a)(1 + c)) with a = token_accept_rate (on rows)"),
    Column("c_draft", "float", "one draft decode step / one baseline target step (on rows)"),
    Column("verify_ratio", "float", "T_verify per round / T_step (on rows)"),
    Column("round_ms", "float", "T_round: mean wall time of a speculative round in the steady state, pooled over repeats (on rows)"),
    Column("step_ms", "float", "T_step: mean wall time of a baseline decode step in the steady state, pooled over repeats"),
    Column("prefill_target_ms", "float", "per run, mean over repeats (a cached shared prefix is not re-prefilled)"),
    Column("prefill_draft_ms", "float", "per run, mean over repeats (on rows)"),
    Column("draft_ms", "float", "per run, mean over repeats (on rows)"),
    Column("verify_ms", "float", "per run, mean over repeats (on rows)"),
    Column("resample_ms", "float", "acceptance, sampling and rollback, per run, mean over repeats (on rows)"),
    Column("decode_ms", "float", "baseline decode steps incl. sampling, per run, mean over repeats (off rows)"),
    Column("total_ms", "float", "wall time of one run, mean over repeats"),
    Column("drafted", "int", "drafted tokens over the timed repeats (on rows)"),
    Column("accepted", "int", "accepted drafts over the timed repeats (on rows)"),
    Column("rounds", "int", "sequence-rounds over the timed repeats (on rows)"),
    Column("emitted", "int", "tokens emitted by rounds over the timed repeats (on rows)"),
    Column("rejected", "int", "rounds that ended on a rejected draft, over the timed repeats (on rows)"),
    Column("accept_at_pos", "str", "acceptance rate of draft positions 1..k, ';'-separated (on rows)"),
    Column("accept_len_hist", "str", "rounds that accepted 0..k drafts, ';'-separated (on rows)"),
    Column("lossless_method", "str", "how the verdict was reached. Sweep on rows: exact-greedy, exact-seed (match), "
           "or distribution (rejection cells: the distributional test plus the match proxy; match-proxy in runs "
           "before it); sweep off rows: reference (the output the on rows are checked against). Serve rows: "
           "alone-greedy or alone-seed (each request against itself decoded alone), distribution (spec-on rows "
           "of the rejection rule at T > 0); empty where a run was not checked"),
    Column("first_divergence", "int", "first generated index where spec and baseline differ (-1: none)"),
    Column("divergence_margin", "float", "target top-1 minus top-2 logit at the first divergence"),
    Column("target_model", "str", "target GGUF file name"),
    Column("target_type", "str", "target file type as llama.cpp names it"),
    Column("target_sha256", "str", "sha256 of the target file"),
    Column("draft_model", "str", "draft GGUF file name (on rows)"),
    Column("draft_type", "str", "draft file type (on rows)"),
    Column("draft_sha256", "str", "sha256 of the draft file (on rows)"),
    Column("backend", "str", "CPU or CUDA, with GPU layers"),
    Column("n_threads", "int", "CPU threads"),
    Column("flash_attn", "bool", "flash attention on"),
    Column("cell_id", "str", "stable key of the cell, used by --resume"),
    Column("run_id", "str", "identifier of the sweep run"),
    # --- how sure each number is (stats.py) ------------------------------------------------
    Column("speedup_ci_low", "float", "lower bound of the speedup's confidence interval: geometric mean of the "
           "paired ratios tps_on_i / tps_off_i, Student t on their logs (on rows)"),
    Column("speedup_ci_high", "float", "upper bound of the speedup's confidence interval (on rows)"),
    Column("tps_ci_low", "float", "lower bound of the tps confidence interval (geometric mean over the repeats, t on logs)"),
    Column("tps_ci_high", "float", "upper bound of the tps confidence interval"),
    Column("ci_level", "float", "confidence level of the intervals, e.g. 0.95"),
    Column("repeats_used", "int", "timed runs actually made (adaptive: between --repeats and --max-repeats)"),
    Column("stop_reason", "str", "why repeating stopped: above-break-even, below-break-even (interval entirely on "
           "one side of speedup 1), narrow (narrower than --ci-width), max-repeats (undecided)"),
    Column("warmup_used", "int", "warm-up runs discarded before timing (at most --warmup)"),
    Column("warmup_settled", "bool", "the warm-up ended because two runs agreed within --warmup-tol (false: it "
           "hit --warmup)"),
    Column("n_outliers", "int", "timed runs flagged as outliers (kept in every number; off rows: tps, on rows: "
           "paired speedup; modified z-score > 3.5)"),
    Column("outlier_note", "str", "each flagged run and why, ';'-separated"),
    # --- what the sequences read (workloads.py) --------------------------------------------------
    Column("task", "str", "task category of the cell's prompts (e.g. chat, code-completion), or 'mixed': "
           "the sequences take the categories in turn"),
    Column("prompt_ids", "str", "the prompt of each sequence, ';'-separated: category/index (built-in suite) or "
           "file:line (--prompts)"),
    Column("prompt_tokens", "float", "mean prompt length per sequence in tokens: ctx_len of shared documents plus "
           "the sequence's own prompt in the chat template"),
    Column("prompts_sha256", "str", "sha256 of the token prompts the cell fed the models (exact identity)"),
    Column("context_sha256", "str", "sha256 of the documents the shared context was cut from (ctx_len > 0)"),
    # --- the lossless verdict (lossless.py) -----------------------------------------------------
    Column("verdict", "str", "exact (token-identical, per seed when sampling), numeric (every divergence within "
           "the measured noise on forced replay), exact-dist (rejection rule: distributed as the target's p, and its "
           "match proxy passed) or fail (a bug: no number); lossless_ok = not fail (on rows); synthetic: a "
           "synthetic acceptance row (never lossless, lossless_ok empty; synthetic_acceptance)"),
    Column("verdict_reason", "str", "where and by how much, in words (on rows)"),
    Column("mismatches", "int", "replayed positions whose emitted token is not the baseline rule's pick (on rows)"),
    Column("max_mismatch_gap", "float", "largest logit[pick] - logit[emitted] among the mismatches (on rows)"),
    Column("noise_tolerance", "float", "the verdict's tolerance: SAFETY x noise_max_spread at T > 0, SAFETY x "
           "noise_candidate_spread at greedy, never below the float floor (64 float32 epsilons times the "
           "largest logit) (on rows)"),
    Column("noise_max_abs_delta", "float", "noise control: max |logit| change, baseline step vs verify batch, "
           "same tokens teacher-forced, this cell's prompts and concurrency (on rows)"),
    Column("noise_max_spread", "float", "noise control: most any pairwise logit gap moved between the shapes (on rows)"),
    Column("noise_flips", "int", "noise control: positions whose greedy choice differed between the shapes (on rows)"),
    Column("noise_positions", "int", "noise control: positions compared (on rows)"),
    # --- steady state (a constant load of `concurrency` sequences) ------------------------------
    Column("steady_tau", "float", "tokens per sequence per round in the steady state, pooled (on rows); "
           "speedup = steady_tau / (1 + verify_cost_c)"),
    Column("noise_state_spread", "float", "noise control of the KV-state check: spread of one more 1-token step's logits "
           "on top of the cache each shape built (on rows)"),
    Column("occupancy", "float", "mean active sequences per iteration / concurrency over whole runs: below 1 where "
           "sequences finished early and left the batch (that tail is outside tps)"),
    # --- which drafter proposed (csrc/drafter.h) ---------------------------------------------------
    Column("drafter", "str", "the cell's drafter: model (the draft GGUF), a llama.cpp n-gram type (ngram-simple, "
           "ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) or hidden-state drafter (dflash, dspark, eagle3, "
           "mtp); off rows: the cell whose baseline they are"),
    Column("drafter_options", "str", "the n-gram drafter's llama.cpp options name=value, ';'-separated, defaults "
           "included (on rows of n-gram cells)"),
    Column("mean_draft_len", "float", "drafted tokens per sequence-round: k for a draft model (less only at the "
           "end; 0..k with draft_p_min > 0), 0..k for an n-gram lookup (on rows)"),
    Column("empty_draft_frac", "float", "share of sequence-rounds in which the drafter proposed nothing: plain "
           "target steps (on rows)"),
    Column("draft_reach", "str", "share of sequence-rounds whose draft reached position 1..k, ';'-separated: "
           "P(L >= j) of the draft length L, all 1 for a draft model away from the end (on rows)"),
    # --- which k (pick_k.py; draft-model cells) -------------------------------------------------
    Column("verify_ms_by_len", "str", "cost curve: median ms of one target decode with 1..k+1 positions per sequence "
           "at this cell's prompts and concurrency, ';'-separated (on rows)"),
    Column("draft_ms_per_pos", "float", "cost curve: median ms of one draft position, one token per sequence (on rows)"),
    Column("predicted_speedup_by_k", "str", "speedup predicted at k' = 1..k from this row's run and the cost curve, "
           "';'-separated (pick_k.py; on rows of draft-model cells)"),
    Column("recommended_k", "int", "the k' <= k with the highest predicted speedup; 0: no k pays (on rows)"),
    Column("recommended_speedup", "float", "the highest predicted speedup (at recommended_k, or at the best k "
           "where no k pays) (on rows)"),
    Column("check_k", "int", "the k measured to check the pick (--check-k): recommended_k, or the best k where "
           "none pays (on rows)"),
    Column("check_k_speedup", "float", "measured steady speedup at check_k, paired with spec-off runs of the same "
           "prompts (--check-k; on rows)"),
    # --- where a round's time goes: inside llama.cpp or the engine's own -------------------
    Column("llama_ms", "float", "of the decoding time (draft+verify+resample, or decode): time inside llama.cpp calls "
           "(llama_decode of baseline, draft and verify batches; a rollback's KV removal; an n-gram drafter's "
           "lookups in common), per run, mean over repeats"),
    Column("engine_own_ms", "float", "of the decoding time: the engine's own time (batch building, sampling, "
           "acceptance), per run, mean over repeats"),
    Column("engine_own_share", "float", "engine_own_ms / decoding time: the engine's own share of a round (on rows) "
           "or of a baseline step (off rows)"),
    # --- the draft model's dynamic stop rule (llama.cpp --spec-draft-p-min) ---------------------------
    Column("draft_p_min", "float", "stop drafting a sequence's round when the draft's top probability falls below "
           "this (llama.cpp's --spec-draft-p-min); 0: always draft k (on rows of draft-model cells)"),
    Column("kv_removal_ms", "float", "of llama_ms: the rollbacks' KV removal (llama_memory_seq_rm on the target's and "
           "the draft's caches; llama.cpp scans every cell, so it grows with n_ctx), per run, mean over repeats"),
    # --- public sets (public_sets.py, --dataset) and what the outputs copy from the prompts -------------
    Column("dataset", "str", "the public set the cell's prompts come from, as name (package==version); empty: "
           "the built-in suite or --prompts. Item ids: prompt_ids"),
    Column("dataset_sha256", "str", "sha256 of the set's data file (pinned in public_sets.py, checked before use)"),
    Column("turn", "int", "MT-Bench: 1, or 2 (asked after turn 1 and the target's own greedy turn-1 answer)"),
    Column("output_lens", "str", "ShareGPT: each sequence's request output length (recorded reply's tokens, capped "
           "at --n-predict), ';'-separated; the cell's n_predict is the longest"),
    Column("prompt_copy_share", "float", "share of the baseline's emitted tokens inside a 4-gram that also occurs "
           "in the sequence's prompt, mean over the cell's distinct prompts (category_table.py)"),
    # --- the rejection rule's distributional verdict (lossless.rejection_distribution) ---------------
    Column("dist_statistic", "float", "rejection cells: KS distance of the emitted tokens' randomized PITs (in "
           "the p of each token's own verify row) from uniform (smallest any placement of exact ties has; on rows)"),
    Column("dist_p_value", "float", "rejection cells: the test's p-value, Bonferroni over its token orders; the "
           "verdict fails below lossless.DIST_ALPHA (on rows)"),
    Column("dist_positions", "int", "rejection cells: emitted tokens tested, pooled over seeded runs (on rows)"),
    Column("dist_runs", "int", "rejection cells: speculative runs (seeds seed, seed+1, ...) pooled (on rows)"),
    Column("proxy_verdict", "str", "rejection cells: the match rule's verdict at the same seed (exact, numeric or "
           "fail), which also checks the KV state; a fail fails the cell (on rows)"),
    # --- serving under load (serving/runner.py; rows with request_rate set) -------------------
    # On these rows `concurrency` is the server's max concurrency (slots), `ctx_len` 0, `tps` the
    # output throughput over the run, `speedup` its on/off ratio on the same trace, `seed` the
    # trace's seed, round_ms/step_ms the mean decoding iteration on/off and verify_cost_c their ratio - 1.
    Column("request_rate", "float", "serve rows: offered requests per second of the arrival process ('inf': all at "
           "t=0; a trace file: its requests over its last arrival time)", infinite=True),
    Column("burstiness", "float", "serve rows: gamma shape of the arrival gaps (1: Poisson), as vLLM's benchmark"),
    Column("n_requests", "int", "serve rows: requests in the trace"),
    Column("trace_sha256", "str", "serve rows: the trace (arrival times, prompt tokens, output lengths), so that on and "
           "off rows of one trace pair up"),
    Column("mean_occupancy", "float", "serve rows: slots holding a request (prefilling or decoding), mean over "
           "iterations; occupancy = this / concurrency"),
    Column("completed", "int", "serve rows: requests completed"),
    Column("duration_s", "float", "serve rows: from the start to the last completion"),
    Column("request_throughput", "float", "serve rows: completed requests per second of duration"),
    Column("output_throughput", "float", "serve rows: generated tokens per second of duration"),
    Column("goodput", "float", "serve rows: requests per second that met every --slo target (DistServe, as vLLM); "
           "without --slo: request_throughput"),
    Column("slo", "str", "serve rows: the --slo targets (e.g. ttft:500,tpot:50), ms"),
    Column("slo_met", "float", "serve rows: share of requests that met every --slo target"),
    Column("ttft_mean_ms", "float", "serve rows: mean of the time to first token (arrival to first token, queueing included), ms"),
    Column("ttft_p50_ms", "float", "serve rows: p50 of the time to first token (arrival to first token, queueing included), ms"),
    Column("ttft_p90_ms", "float", "serve rows: p90 of the time to first token (arrival to first token, queueing included), ms"),
    Column("ttft_p99_ms", "float", "serve rows: p99 of the time to first token (arrival to first token, queueing included), ms"),
    Column("tpot_mean_ms", "float", "serve rows: mean of the time per output token after the first, per request, ms"),
    Column("tpot_p50_ms", "float", "serve rows: p50 of the time per output token after the first, per request, ms"),
    Column("tpot_p90_ms", "float", "serve rows: p90 of the time per output token after the first, per request, ms"),
    Column("tpot_p99_ms", "float", "serve rows: p99 of the time per output token after the first, per request, ms"),
    Column("itl_mean_ms", "float", "serve rows: mean of the inter-token latency: gaps between emissions, pooled over requests (a speculative round emits several tokens at once: one gap), ms"),
    Column("itl_p50_ms", "float", "serve rows: p50 of the inter-token latency: gaps between emissions, pooled over requests (a speculative round emits several tokens at once: one gap), ms"),
    Column("itl_p90_ms", "float", "serve rows: p90 of the inter-token latency: gaps between emissions, pooled over requests (a speculative round emits several tokens at once: one gap), ms"),
    Column("itl_p99_ms", "float", "serve rows: p99 of the inter-token latency: gaps between emissions, pooled over requests (a speculative round emits several tokens at once: one gap), ms"),
    Column("e2e_mean_ms", "float", "serve rows: mean of the end-to-end latency (arrival to last token), ms"),
    Column("e2e_p50_ms", "float", "serve rows: p50 of the end-to-end latency (arrival to last token), ms"),
    Column("e2e_p90_ms", "float", "serve rows: p90 of the end-to-end latency (arrival to last token), ms"),
    Column("e2e_p99_ms", "float", "serve rows: p99 of the end-to-end latency (arrival to last token), ms"),
    Column("queue_mean_ms", "float", "serve rows: mean of the queueing delay (arrival to admission into a slot), ms"),
    Column("queue_p50_ms", "float", "serve rows: p50 of the queueing delay (arrival to admission into a slot), ms"),
    Column("queue_p90_ms", "float", "serve rows: p90 of the queueing delay (arrival to admission into a slot), ms"),
    Column("queue_p99_ms", "float", "serve rows: p99 of the queueing delay (arrival to admission into a slot), ms"),
    Column("iteration_ms", "float", "serve rows: mean wall time of an iteration that decoded (a round on on rows, a "
           "step on off rows), prompt chunks riding along included"),
    Column("mixed_step_frac", "float", "serve rows: share of decoding iterations whose batch also carried prompt "
           "chunks (prefill interference)"),
    Column("kv_cells_left", "int", "serve rows: KV cells (target + draft) still held after the last request: 0, or a leak"),
    # --- llama.cpp's hidden-state drafters (dflash, dspark, eagle3, mtp) --------------------
    Column("draft_ingest_ms", "float", "the drafter reading each verify batch's target features (a hidden-state "
           "drafter's common_speculative_process: feature copy, draft KV injection, EAGLE-3's encoder), "
           "synchronised, per run, mean over repeats (on rows; 0 for the other drafters)"),
    Column("settings_step_ms", "float", "T_step of the baseline decoding under the hidden-state drafter's target "
           "settings (layer-input or nextn extraction on); step_ms stays the plain target's (on rows)"),
    Column("settings_step_cost", "float", "settings_step_ms / step_ms - 1: what the extraction settings cost the "
           "target's plain step (on rows of hidden-state drafters)"),
    Column("drafter_kind", "str", "what a hidden-state drafter's file is, from its GGUF (as llama.cpp infers it): "
           "dflash, dflash2 (DFlash with conv + selector), dspark, eagle3; mtp: the target's nextn head (on rows)"),
    Column("noise_candidate_spread", "float", "noise control: most the logit gaps among each position's candidates "
           "moved (tokens within lossless.CANDIDATE_WINDOW x the spread of the top): what a greedy choice depends "
           "on (on rows)"),
    # --- every timed repeat, for paired statistics across runs (specnative compare, tidy.csv) ----------
    Column("tps_repeats", "str", "the steady-state tokens/s of every timed repeat, in order, ';'-separated"),
    Column("speedup_repeats", "str", "on rows: every repeat's paired speedup tps_on / tps_off, in order, "
           "';'-separated (the speedup interval is over these)"),
    # --- prefix caching as a factor (--prefix-cache on,off) and end-to-end rates ----------------------
    Column("prefix_cache", "str", "on: the shared context's KV cells computed once, shared by the sequences and "
           "kept between calls; off: every sequence prefills its own copy on every call (a server without "
           "prompt caching)"),
    Column("prefill_tokens", "float", "prompt tokens the target's prefill fed per run (a cached prefix is not fed "
           "again): the repeated prefill that prefix caching saves"),
    Column("kv_prompt_cells", "int", "KV cells the prompts occupy (a shared, cached prefix counted once)"),
    Column("e2e_tps", "float", "end-to-end tokens/s over the timed runs: every generated token over the whole "
           "run's time, the prefill included"),
    Column("e2e_tps_repeats", "str", "e2e_tps of every timed repeat, in order, ';'-separated"),
    # --- the rejection rule's own decisions in the distributional verdict (lossless.distribution) ------
    Column("dist_decisions", "int", "rejection cells: drafts the acceptance walk reached, each judged against "
           "min(1, p/q) from its own verify row and the q that proposed it (on rows)"),
    Column("dist_decision_p_value", "float", "rejection cells: the acceptance decisions' own p-value (the smaller of "
           "their randomized PIT's KS test and the count of drafts kept, before Bonferroni; on rows)"),
    Column("dist_residuals", "int", "rejection cells: rejections whose correction token was placed in "
           "norm(max(0, p - q)) (on rows)"),
    Column("dist_residual_p_value", "float", "rejection cells: the corrections' own p-value (KS of their randomized "
           "PIT in the residual, before Bonferroni; on rows)"),
    Column("dist_decided_by", "str", "rejection cells: the distributional test's statistic with the smallest p-value "
           "(target, draft, bonus, decisions, acceptances, residuals: lossless.distribution.STATISTICS; on rows)"),
    # --- synthetic acceptance (--synthetic-acceptance): drafts kept at random, verdict "synthetic" ------
    Column("synthetic_acceptance", "str", "synthetic rows: the requested profile as given (a per-token alpha a, "
           "rates:r1/r2/... or len:L; specnative.engine.synthetic); empty on real rows"),
    Column("synthetic_rates", "str", "synthetic rows: the requested unconditional acceptance rate of draft positions "
           "1..k, ';'-separated (realised: accept_at_pos)"),
    Column("synthetic_alpha", "float", "synthetic rows: the requested per-token alpha, the constant one with the "
           "profile's expected tokens per round at k (realised: token_accept_rate)"),
    # --- draft trees (--draft-shape; empty on chain rows) ----------------------------------------
    Column("draft_shape", "str", "a draft tree's shape, e.g. tree:topk=4,depth=5,budget=8 or "
           "tree:branches=4,p_split=0.1,budget=8 (empty: a chain of k); k is then its node budget, drafted "
           "counts every verified node, accept_at_pos is by depth, predicted_speedup is empty (the closed form "
           "is a chain's) and c_draft is per draft decode (on rows)"),
    Column("nodes_per_round", "float", "draft trees: tree nodes verified per round (drafted / rounds; the pending "
           "token comes on top) (on rows)"),
    Column("accept_at_rank", "str", "draft trees: by sibling rank 0, 1, ... (draw order), the share of the walk's "
           "visits to a node with a child of that rank that moved on to it, ';'-separated (on rows)"),
    Column("spec_policy", "str", "how many tokens each sequence drafts per round: static (k every round), adaptive, "
           "or by-batch:[[lo,hi,k],...] (docs/adaptive.md; on rows)"),
    Column("k_chosen_hist", "str", "sequence-rounds the spec policy allowed 0..k drafts, ';'-separated (on rows)"),
    Column("k0_share", "float", "share of sequence-rounds the spec policy allowed no draft (k = 0: one token, as a "
           "baseline step; on rows)"),
    Column("policy_ms_per_round", "float", "the spec policy's own time per round, ms (its start-up apart; on rows)"),
    Column("policy_startup_ms", "float", "the adaptive policy's start-up timing of the target's verify by rows, ms "
           "(on rows)"),
)

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
REQUIRED: tuple[str, ...] = COLUMN_NAMES[:9]
DRAFT_ONLY: tuple[str, ...] = (
    "draft_accept_rate", "verify_cost_c", "k", "accept_rule", "token_accept_rate", "mean_accept_len", "predicted_speedup",
    "c_draft", "verify_ratio", "round_ms", "prefill_draft_ms", "draft_ms", "verify_ms", "resample_ms",
    "drafted", "accepted", "rounds", "emitted", "rejected", "accept_at_pos", "accept_len_hist", "draft_model",
    "draft_type", "draft_sha256", "drafter_options", "mean_draft_len", "empty_draft_frac",
    "draft_reach",
    "verify_ms_by_len", "draft_ms_per_pos", "predicted_speedup_by_k", "recommended_k", "recommended_speedup",
    "check_k", "check_k_speedup", "draft_p_min", "draft_ingest_ms", "settings_step_ms", "settings_step_cost",
    "drafter_kind", "synthetic_acceptance", "synthetic_rates", "synthetic_alpha", "draft_shape", "nodes_per_round",
    "accept_at_rank", "spec_policy", "k_chosen_hist", "k0_share", "policy_ms_per_round", "policy_startup_ms")
PANDAS_DTYPES = {"int": "Int64", "float": "float64", "str": "string", "bool": "boolean"}


def _format(value, dtype: str) -> str:
    if value is None:
        return ""
    if dtype == "float":
        value = float(value)
        return "" if math.isnan(value) else f"{value:.6g}"
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int":
        return str(int(value))
    return str(value)


def format_row(row: dict) -> list[str]:
    """Values in schema order as CSV strings; unknown keys are an error (a schema change)."""
    unknown = set(row) - set(COLUMN_NAMES)
    if unknown:
        raise KeyError(f"not in the traces.csv schema: {sorted(unknown)}")
    if row.get("spec_decode") == "off":
        row = {k: v for k, v in row.items() if k not in DRAFT_ONLY}
    return [_format(row.get(c.name), c.dtype) for c in COLUMNS]


def append_rows(path: Path, rows: list[dict]) -> None:
    """Appends rows (writing the header to a new file) and flushes them to disk."""
    path = Path(path)
    new_file = not path.exists() or path.stat().st_size == 0
    if not new_file:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != COLUMN_NAMES:
            raise ValueError(f"{path} has a different header than this specnative's schema; "
                             f"write to a new output directory")
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new_file:
            writer.writerow(COLUMN_NAMES)
        for row in rows:
            writer.writerow(format_row(row))
        f.flush()
        import os
        os.fsync(f.fileno())


def with_all_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Adds any schema column a frame lacks (a file from an older specnative), empty."""
    for column in COLUMNS:
        if column.name not in frame:
            frame[column.name] = pd.Series(index=frame.index, dtype=PANDAS_DTYPES[column.dtype])
    return frame


class TracesError(ValueError):
    """A traces.csv that cannot be read as the schema says: the message names the file, the line
    (where there is one) and what is wrong, in one line."""


def _csv_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, fields) of every data row; a row whose field count differs from
    the header's (a half-written or garbage line) is an error, not silently padded."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TracesError(f"{path}: no such file (did the sweep measure any cell?)") from None
    except UnicodeDecodeError as error:
        raise TracesError(f"{path}: not UTF-8 text (byte {error.start}): not a traces.csv") from None
    except OSError as error:
        raise TracesError(f"{path}: cannot read it ({error.strerror})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    try:
        for fields in reader:
            if fields:  # blank lines carry nothing
                rows.append((reader.line_num, fields))
    except csv.Error as error:
        raise TracesError(f"{path}:{reader.line_num}: not CSV ({error})") from None
    if not rows:
        raise TracesError(f"{path}: the file is empty (no header)")
    (_, header), data = rows[0], rows[1:]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        raise TracesError(f"{path}:1: the header lacks required column(s) {', '.join(missing)}: "
                          f"not a specnative traces.csv, or a damaged one")
    if len(set(header)) != len(header):
        raise TracesError(f"{path}:1: the header repeats a column name")
    for line, fields in data:
        if len(fields) != len(header):
            raise TracesError(f"{path}:{line}: {len(fields)} fields where the header has {len(header)} "
                              f"(a half-written or garbage line; a sweep with --resume repairs a torn last row)")
    return header, data


def _typed(values: pd.Series, column: Column, path: Path, lines: list[int]) -> pd.Series:
    """One column converted to its schema type; the first value that does not convert is an
    error naming its line."""
    values = values.replace("", pd.NA)
    if column.dtype == "bool":
        converted = values.map(_BOOLS, na_action="ignore")
        bad = converted.isna() & values.notna()
    elif column.dtype in ("int", "float"):
        converted = pd.to_numeric(values, errors="coerce")
        bad = converted.isna() & values.notna()
        if column.dtype == "int":  # an infinity equals its own rounding: not an int either
            bad |= converted.notna() & ((converted != converted.round()) | converted.isin([math.inf, -math.inf]))
        else:  # a sweep writes NaN (empty) where a number is undefined, never an infinity
            infinite = converted.isin([-math.inf] if column.infinite else [math.inf, -math.inf])
            if infinite.any():
                i = int(infinite.to_numpy().nonzero()[0][0])
                raise TracesError(f"{path}:{lines[i]}: column {column.name} holds {values.iloc[i]!r}, "
                                  f"not a finite number (no measurement is infinite: an edited or damaged file)")
    else:
        if column.name.endswith("_repeats"):  # a ';'-separated list of finite rates >= 0
            bad = [i for i, v in enumerate(values) if isinstance(v, str) and _not_a_rate_list(v)]
            if bad:
                i = bad[0]
                raise TracesError(f"{path}:{lines[i]}: column {column.name} holds {values.iloc[i]!r}, not "
                                  f"';'-separated finite numbers >= 0 (an edited or damaged file)")
        return values.astype(PANDAS_DTYPES[column.dtype])
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise TracesError(f"{path}:{lines[i]}: column {column.name} holds {values.iloc[i]!r}, "
                          f"not a {column.dtype}")
    return converted.astype(PANDAS_DTYPES[column.dtype])


def _not_a_rate_list(text: str) -> bool:
    try:
        values = [float(v) for v in text.split(";") if v.strip()]
    except ValueError:
        return True
    return not all(0 <= v < math.inf or v != v for v in values)  # NaN: a repeat whose rate is undefined


_BOOLS = {"true": True, "false": False, "True": True, "False": False}
# Required columns that every measured row fills (off rows leave the draft ones empty).
ALWAYS_FILLED = ("quant_bits", "spec_decode", "concurrency", "ctx_len", "tps", "seed")


def read_traces(path) -> pd.DataFrame:
    """traces.csv as a DataFrame with the schema's types (nullable ints, booleans, strings);
    columns a file lacks (written by an older specnative) are present and empty, except the
    seed's required ones. A file that does not read as the schema says raises TracesError."""
    path = Path(path)
    header, data = _csv_rows(path)
    lines = [line for line, _ in data]
    frame = pd.DataFrame([fields for _, fields in data], columns=header, dtype=str)
    for name in ALWAYS_FILLED:  # every row has these: an empty one is a damaged row, not "n/a"
        empty = (frame[name] == "").to_numpy().nonzero()[0]
        if empty.size:
            raise TracesError(f"{path}:{lines[empty[0]]}: column {name} is empty")
    bad = (~frame["spec_decode"].isin(["on", "off"])).to_numpy().nonzero()[0]
    if bad.size:
        raise TracesError(f"{path}:{lines[bad[0]]}: spec_decode is {frame['spec_decode'].iloc[bad[0]]!r}, "
                          f"not 'on' or 'off'")
    for column in COLUMNS:
        if column.name in frame:
            frame[column.name] = _typed(frame[column.name], column, path, lines)
    return with_all_columns(frame)


def markdown_doc() -> str:
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.doc} |" for c in COLUMNS]
    return "\n".join(lines)



def serve_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """The load sweep's rows (request_rate set)."""
    if "request_rate" not in traces:
        return traces.iloc[0:0]
    return traces[traces["request_rate"].notna()]


def is_serve_run(traces: pd.DataFrame) -> bool:
    return not serve_rows(traces).empty


def synthetic_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """The synthetic acceptance rows (synthetic_acceptance set): never lossless, kept out of the
    verdicts, the advice about real drafters and compare's gates."""
    if "synthetic_acceptance" not in traces:
        return traces.iloc[0:0]
    return traces[traces["synthetic_acceptance"].notna()]


def real_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """Every row but the synthetic acceptance ones (what the verdicts and the advice are about)."""
    if "synthetic_acceptance" not in traces:
        return traces
    return traces[traces["synthetic_acceptance"].isna()]


def is_tree_row(traces: pd.DataFrame) -> pd.Series:
    """Rows of draft trees (an on row with a draft_shape)."""
    if "draft_shape" not in traces:
        return pd.Series(False, index=traces.index)
    return traces["draft_shape"].fillna("").astype(str).str.startswith("tree:")
