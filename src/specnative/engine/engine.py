"""The public engine: load a target (and optionally a draft) GGUF model, generate for N
concurrent sequences with or without speculation, and get exact counts and step timers back.

All measuring happens in the C++ core (specnative._core); this module only turns Python inputs
into token lists, checks what is cheaper to check here, and wraps the result.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from specnative import _core
from specnative.engine import gguf_checks
from specnative.engine.decode_spec import _INT32, DecodeSpec, _c_int

Prompt = Union[str, Sequence[int], np.ndarray]


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _flash_attn_code(flash_attn) -> int:
    if flash_attn == "auto":
        return -1
    if isinstance(flash_attn, bool):
        return int(flash_attn)
    raise ValueError(f"flash_attn must be True, False or 'auto', not {flash_attn!r}")


def _token_ids(tokens, what: str) -> list[int]:
    """A 1-D sequence of integer token ids as a list (booleans, floats and nesting refused; the
    engine checks the ids against the vocabulary)."""
    array = np.asarray(tokens, dtype=object) if not isinstance(tokens, np.ndarray) else tokens
    if array.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids, not {array.ndim}-D")
    ids = []
    for t in array.tolist():
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise ValueError(f"{what} must hold integer token ids, not {t!r}")
        if not _INT32[0] <= int(t) < _INT32[1]:
            raise ValueError(f"{what} has token id {t} outside the vocabulary")
        ids.append(int(t))
    return ids


def _utf8(text: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"text is not encodable as UTF-8 ({error.reason} at index {error.start})") from None
    return text


SPLIT_MODES = ("none", "layer", "row", "tensor")  # llama.cpp's -sm


def _names(value, what: str) -> list[str]:
    """A list of names from a list or a comma-separated string (llama.cpp's "a,b"); None: []."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise ValueError(f"{what} must be names (a list or 'a,b'), not {value!r}")
    return [item.strip() for item in items]


def _tensor_split(value) -> list[float]:
    """llama.cpp's -ts: proportions per device, a list or '3,1'; the core checks the values."""
    if value is None:
        return []
    items = value.replace("/", ",").split(",") if isinstance(value, str) else list(value)
    try:
        return [float(item) for item in items]
    except (TypeError, ValueError):
        raise ValueError(f"tensor_split must be numbers (a list or '3,1'), not {value!r}") from None


def placement_args(split_mode="layer", tensor_split=None, main_gpu=0, devices=None, draft_devices=None,
                   n_gpu_layers_draft=None, rpc_servers=None, rpc_timeout_s: float = 5.0) -> dict:
    """The core Engine's placement arguments (llama.cpp's -sm, -ts, -mg, -dev, -devd, -ngld, --rpc)."""
    if split_mode not in SPLIT_MODES:
        raise ValueError(f"split_mode must be one of {', '.join(SPLIT_MODES)}, not {split_mode!r}")
    if not (isinstance(rpc_timeout_s, (int, float)) and 0 < rpc_timeout_s <= 600):
        raise ValueError(f"rpc_timeout_s must be a number of seconds in (0, 600], not {rpc_timeout_s!r}")
    return {"split_mode": split_mode, "tensor_split": _tensor_split(tensor_split),
            "main_gpu": _c_int(main_gpu, "main_gpu"), "devices": _names(devices, "devices"),
            "draft_devices": _names(draft_devices, "draft_devices"),
            "n_gpu_layers_draft": None if n_gpu_layers_draft is None else _c_int(n_gpu_layers_draft, "n_gpu_layers_draft"),
            "rpc_servers": _names(rpc_servers, "rpc_servers"), "rpc_timeout_ms": int(rpc_timeout_s * 1000)}


def _check_model_file(path, role: str) -> str:
    """The path of an existing model file whose header llama.cpp can load without aborting
    (gguf_checks: a ValueError naming the file and the field)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{role} model not found: {path}")
    gguf_checks.check_model_file(path, role)
    return str(path)


@dataclass
class GenerationResult:
    """What one generate() call measured. Times are milliseconds of wall clock."""

    tokens: list            # per sequence: np.int32 array of generated ids (a final EOS included)
    texts: list             # per sequence: decoded text (special tokens dropped); a view of the
                            # tokens, decoded as UTF-8 with errors="replace": bytes that are not
                            # valid UTF-8 (byte tokens, a reply cut mid-character) become U+FFFD
                            # and never cost the tokens, counts or timers
    times: dict             # prefill_target, prefill_draft, draft, draft_ingest, verify, resample,
                            # decode, total;
                            # llama: the part of the decoding steps inside llama.cpp (engine_own)
    steps: int              # baseline decode steps or speculative rounds
    decode_tokens: int      # tokens produced after prefill, all sequences together
    tps: float              # decode_tokens per second of decoding (prefill excluded)
    speculative: bool
    draft_accept_rate: float = float("nan")  # alpha = accepted / drafted
    token_accept_rate: float = float("nan")  # accepted / (accepted + rejected): per reached draft
    mean_accept_len: float = float("nan")    # tau = emitted / rounds (bonus token included)
    round_ms: float = float("nan")           # T_round, speculative runs
    step_ms: float = float("nan")            # T_step, baseline runs
    # Steady state: only the iterations (rounds or steps) in which every sequence was active, as
    # under a server's constant load N; steady_tps(on) / steady_tps(off) = steady_tau / (1 + c)
    # exactly, with c = T_round / T_step - 1 from steady_iteration_ms.
    steady: dict = field(default_factory=dict)  # steps, tokens, ms, tps, iteration_ms, tau
    occupancy: float = float("nan")          # mean active sequences per iteration / sequences
    totals: dict = field(default_factory=dict)  # drafted, accepted, rounds, emitted, *_at, hist
    counts: list = field(default_factory=list)  # the same per sequence
    margins: list = field(default_factory=list)  # per sequence: target top-1 minus top-2 logit
                                                 # per token (record_margins=True only)
    pit: list = field(default_factory=list)  # per sequence: {field: array} (record_pit=True only)
    drafter: str = ""                            # speculative runs: which drafter proposed
    drafter_options: dict = field(default_factory=dict)  # its llama.cpp options (n-gram types)
    draft_p_min: float = 0.0                     # the draft model's stop rule (0 = fixed k)
    prefill_tokens: int = 0    # prompt tokens the target's prefill fed (a cached prefix is not fed again)
    kv_prompt_cells: int = 0   # KV cells the prompts occupy (a shared, cached prefix counted once)

    @property
    def per_position_accept_rate(self) -> np.ndarray:
        """Acceptance rate of draft position 1..k (NaN where nothing was drafted)."""
        drafted = self.totals.get("drafted_at", np.zeros(0))
        accepted = self.totals.get("accepted_at", np.zeros(0))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(drafted > 0, accepted / np.maximum(drafted, 1), np.nan)

    @property
    def mean_draft_len(self) -> float:
        """Tokens drafted per sequence-round (k for a draft model away from the end; 0..k for
        an n-gram lookup, which proposes nothing where the history has no match)."""
        rounds = self.totals.get("rounds", 0)
        return self.totals["drafted"] / rounds if rounds else float("nan")

    @property
    def empty_draft_rounds(self) -> int:
        """Sequence-rounds in which the drafter proposed nothing (plain target steps)."""
        if not self.totals:
            return 0
        drafted_first = self.totals["drafted_at"][0] if len(self.totals["drafted_at"]) else 0
        return int(self.totals["rounds"] - drafted_first)

    @property
    def n_generated(self) -> int:
        return int(sum(len(t) for t in self.tokens))

    @property
    def engine_own(self) -> dict:
        """Where this run's decoding time went: inside llama.cpp or the engine's own (engine_own_time)."""
        return engine_own_time(decoding_ms(self.times), self.times.get("llama", float("nan")),
                               self.times.get("kv_removal", float("nan")))


DECODING_STEPS = ("draft", "draft_ingest", "verify", "resample", "decode")  # the timers after prefill


def decoding_ms(times: dict) -> float:
    """A run's decoding time: its step timers after prefill (draft+draft_ingest+verify+resample,
    or decode), and the spec policy's own time in the rounds (its one-off start-up is not a
    round's: times["policy_startup"], reported apart)."""
    rounds_policy = times.get("policy", 0.0) - times.get("policy_startup", 0.0)
    return float(sum(times.get(s, 0.0) for s in DECODING_STEPS) + rounds_policy)


def engine_own_time(decoding: float, llama: float, kv_removal: float = float("nan")) -> dict:
    """The one definition of the engine's own time: of `decoding` ms (decoding_ms), what
    was not inside llama.cpp calls (`llama` ms: every decode of the baseline, draft and verify
    batches, a rollback's KV removal, an n-gram drafter's lookups) is the engine's own: batch
    building, sampling, acceptance. `kv_removal` (part of `llama`) is passed through on its own:
    llama.cpp's removal scans the whole cache, so it grows with n_ctx. Returns llama_ms,
    kv_removal_ms, engine_own_ms and engine_own_share (of decoding)."""
    own = decoding - llama
    share = own / decoding if decoding > 0 else float("nan")
    return {"llama_ms": llama, "kv_removal_ms": kv_removal, "engine_own_ms": own, "engine_own_share": share}


def rpc_device_names(rpc_servers) -> list[str]:
    """Device names (RPC0, ...) of RPC servers already added by an Engine, in the servers' order:
    what `devices` names to put a model on them."""
    return list(_core.rpc_device_names(_names(rpc_servers, "rpc_servers")))


class Engine:
    """A target model, an optional draft model, and one llama.cpp context for each.

    Threads: an Engine may be shared between threads; its calls are serialized (one at a time,
    the others wait). close() from another thread (or a signal handler) stops a running
    generate() at its next step (that call raises RuntimeError), waits for it, then frees the
    models; every call after close() raises ValueError. For parallel decoding, give each thread
    its own Engine.

    >>> with Engine("target.gguf", "draft.gguf", n_seq_max=4) as engine:
    ...     base = engine.generate(["Hello", "Once upon"], n_predict=64)
    ...     spec = engine.generate(["Hello", "Once upon"], n_predict=64, spec=True, k=4)
    """

    def __init__(self, target, draft=None, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, n_seq_max: int = 8,
                 flash_attn=False, kv_unified: bool = True, split_mode: str = "layer", tensor_split=None,
                 main_gpu: int = 0, devices=None, draft_devices=None, n_gpu_layers_draft: int | None = None,
                 rpc_servers=None, rpc_timeout_s: float = 5.0, mtp: bool = False):
        """Placement, with llama.cpp's names: `split_mode` (-sm: none, layer, row, tensor),
        `tensor_split` (-ts: proportions per device), `main_gpu` (-mg), `devices` (-dev: device
        names such as CUDA0 or RPC0, or "none"), and for the draft `draft_devices` (-devd) and
        `n_gpu_layers_draft` (-ngld), which follow the target's when None. `rpc_servers` (--rpc:
        "host:port" of running rpc-servers) adds their devices (RPC0, RPC1, ... in order; see
        `rpc_device_names`); a server not reached within `rpc_timeout_s` is a ValueError.

        `draft` may also be a hidden-state drafter file (a DFlash, DFlash2, DSpark or EAGLE-3
        GGUF for this target; see `hidden_drafter`), run with drafter="dflash"/"dspark"/"eagle3";
        `mtp=True` loads the target's own nextn (MTP) head for drafter="mtp" (no draft file).
        A pair llama.cpp cannot run, or a header field llama.cpp would abort on (a block count of
        0, kv heads that do not divide the heads, a DFlash mask token outside the vocabulary, ...:
        engine.gguf_checks), is refused before anything is loaded."""
        self.target_path = _check_model_file(target, "target")
        self.draft_path = _check_model_file(draft, "draft") if draft is not None else None
        self._core = _core.Engine(
            target=self.target_path, draft=self.draft_path or "", n_ctx=_c_int(n_ctx, "n_ctx"),
            n_batch=_c_int(n_batch, "n_batch"), n_threads=_c_int(n_threads or default_threads(), "n_threads"),
            n_gpu_layers=_c_int(n_gpu_layers, "n_gpu_layers"), n_seq_max=_c_int(n_seq_max, "n_seq_max"),
            flash_attn=_flash_attn_code(flash_attn), kv_unified=bool(kv_unified),
            **placement_args(split_mode, tensor_split, main_gpu, devices, draft_devices, n_gpu_layers_draft,
                             rpc_servers, rpc_timeout_s), mtp=bool(mtp))
        self._n_vocab = int(self._core.target_info["n_vocab"])

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        self._core.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- models ---------------------------------------------------------------------------------
    @property
    def target_info(self) -> dict:
        return self._core.target_info

    @property
    def draft_info(self) -> dict | None:
        has_file = self._core.has_draft or self._core.hidden_drafter not in ("", "mtp")
        return self._core.draft_info if has_file else None

    @property
    def hidden_drafter(self) -> str:
        """The hidden-state drafter this engine holds, as inferred from its draft file's GGUF
        (dflash, dflash2: DFlash with conv + selector, dspark: DFlash + Markov head, eagle3) or
        "mtp" (mtp=True); "" for none."""
        return self._core.hidden_drafter

    def context_info(self, draft: bool = False) -> dict:
        """The target's (or the draft's) llama_context as llama.cpp set it up: n_ctx, n_batch,
        n_ubatch, n_seq_max, n_threads(_batch), kv_unified, swa_full, flash_attn; and its perf
        counters since it was made: n_eval, n_p_eval, n_reused (graphs reused, not rebuilt)."""
        return self._core.context_info(draft)

    @property
    def n_ctx(self) -> int:
        return self._core.n_ctx

    @property
    def n_ctx_seq(self) -> int:
        """KV cells one sequence can use (all of n_ctx when the cache is unified)."""
        return self._core.n_ctx_seq

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return np.asarray(self._core.tokenize(_utf8(text), add_special), dtype=np.int32)

    def detokenize(self, tokens) -> str:
        """Text of `tokens`, decoded as UTF-8 with errors="replace" (see GenerationResult.texts)."""
        ids = _token_ids(tokens, "tokens")
        bad = next((t for t in ids if not 0 <= t < self._n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self._n_vocab})")
        return self._core.detokenize(ids).decode("utf-8", errors="replace")

    # -- decoding -------------------------------------------------------------------------------
    def to_token_prompts(self, prompts) -> list[list[int]]:
        """One token list per sequence from: a text; a 1-D token-id list or array (one prompt);
        a 2-D integer array (one prompt per row); or a list of texts and 1-D token lists.
        Booleans are not token ids; deeper nesting is refused."""
        if isinstance(prompts, np.ndarray):
            if prompts.ndim not in (1, 2):
                raise ValueError(f"a prompt array must be 1-D (one prompt) or 2-D (one prompt per row), "
                                 f"not {prompts.ndim}-D")
            prompts = [prompts] if prompts.ndim == 1 else list(prompts)
        elif isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                          and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a text, a token list, or a non-empty list of those")
        out = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str) and not prompt:
                raise ValueError(f"prompt {i} is empty")
            tokens = self.tokenize(prompt).tolist() if isinstance(prompt, str) else \
                _token_ids(prompt, f"prompt {i}")
            if not tokens:
                raise ValueError(f"prompt {i} is empty")
            out.append(tokens)
        return out

    def generate(self, prompts, decode: DecodeSpec | None = None, **fields) -> GenerationResult:
        """Decode all prompts together under `decode`, a DecodeSpec (engine/decode_spec.py); or give
        its fields as keywords, generate(prompts, n_predict=64, spec=True, k=4), which builds one;
        keywords beside a spec replace its fields. Every field is checked when the spec is made (one
        ValueError naming the field); the call runs in the C++ core with the GIL released.

        The fields: n_predict=32, temperature=0.0, seed=0, spec=False, k=4, accept_rule="greedy",
        stop_at_eos=True, record_margins=False, drafter="model", drafter_options=None (or {}),
        draft_p_min=0.0, draft_temperature=None, drafter_settings=False, record_pit=False,
        prefix_cache=True, synthetic=None, prefix_limit=None, draft_shape=None.

        With spec=True the drafter proposes up to k tokens per
        round and `accept_rule` (greedy, match or rejection) decides what the target keeps.
        drafter: "model" (the draft GGUF) or one of llama.cpp's model-free n-gram drafters
        (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache), which propose 0..k
        tokens by lookup in each sequence's history; drafter_options sets their parameters by
        llama.cpp's CLI names (e.g. {"spec-ngram-mod-n-min": 8}; see drafter_defaults()). The
        drafter is chosen per call, not per Engine: one loaded target serves every drafter, and
        an n-gram drafter starts from the prompts afresh on every call (repeatable measurements).
        At temperature > 0 an n-gram draft is deterministic (q one-hot): `rejection` accepts it
        with probability p(x), `match` when the target's keyed sample equals it.
        record_margins: also return the target's top-1 minus top-2 logit for every token (one
        more pass over the vocabulary per token; for lossless diagnostics, not timed runs).
        draft_p_min: llama.cpp's --spec-draft-p-min for the draft model: a sequence stops drafting
        for the round at the first position whose top draft probability (softmax at temperature 1
        over the 10 largest draft logits, as llama.cpp's draft sampler computes it, at any
        generation temperature) is below p, so it proposes 0..k tokens. 0 (default) = off.
        draft_temperature: the draft model samples at this temperature instead of `temperature`
        (sampling only; None = the same). Lossless for any value under `rejection`; a hotter draft
        makes rejections frequent (lossless.rejection_distribution uses it to exercise the rule).
        The hidden-state drafters (dflash, dspark, eagle3, mtp; llama.cpp's draft-* spellings
        too) read the target's features after every target decode (times["draft_ingest"]); their
        proposals are deterministic (q one-hot), and DFlash drafts at most block_size - 1.
        drafter_settings (baseline only): decode under that hidden-state drafter's target
        settings (feature extraction on), to measure what they cost the plain step.
        record_pit (rejection rule only): for every token a round emits, its place in the p of its
        own verify row (pit: per sequence, arrays index, p_emitted, above_sure/_maybe in p's order,
        draft_above_sure/_maybe in the draft's): lossless.rejection_distribution's evidence.
        prefix_cache: the prompts' common prefix is prefilled once, shared by every sequence and kept
        cached between calls (the default); False: every sequence prefills its whole prompt on every
        call, as a server without prompt caching (times["prefill_target"] shows the cost).
        prefix_limit (with prefix_cache): share and keep at most this many leading tokens, the shared
        context's length (the sweep passes ctx_len); each sequence's own prompt is then prefilled on
        every call, even where one sequence's whole prompt is the common prefix. None: the prompts'
        whole common prefix.
        synthetic (spec only): a synthetic acceptance profile (specnative.engine.synthetic: a Profile or its
        text, e.g. "0.7", "rates:0.9/0.7/0.5/0.3", "len:2.5"): the drafter drafts and the target
        verifies as usual, but each draft is kept by a seeded draw at the profile's rate instead of
        by the rule; the first rejected position emits the target's own token there. Benchmarking
        only: the output is not the target's.
        draft_shape (draft model only): "chain" (None, the default: k tokens in a line) or a tree,
        e.g. "tree:topk=4,depth=5,budget=8" (EAGLE-2 / SGLang) or "tree:branches=4,p_split=0.1,
        budget=8" (llama.cpp's examples/speculative); k is then unused (engine/draft_shape.py). All
        nodes are verified in one target batch; the engine needs n_seq_max >= sequences x
        DraftShape.ids_per_sequence. Counts then also hold offered_rank/accepted_rank (siblings by
        rank), and drafted counts every verified node."""
        if decode is None:
            decode = DecodeSpec(**fields)
        elif not isinstance(decode, DecodeSpec):
            raise ValueError(f"decode must be a DecodeSpec, not {type(decode).__name__}")
        elif fields:
            decode = dataclasses.replace(decode, **fields)
        token_prompts = self.to_token_prompts(prompts)
        raw = self._core.generate(token_prompts, decode.core_params())
        spec_on = raw.speculative
        return GenerationResult(
            tokens=raw.tokens, texts=[t.decode("utf-8", errors="replace") for t in raw.texts],
            times=raw.times,
            steps=raw.steps, decode_tokens=raw.decode_tokens, tps=raw.tps,
            speculative=raw.speculative, draft_accept_rate=raw.draft_accept_rate,
            token_accept_rate=raw.token_accept_rate,
            mean_accept_len=raw.mean_accept_len, round_ms=raw.round_ms, step_ms=raw.step_ms,
            steady={"steps": raw.steady_steps, "tokens": raw.steady_tokens, "ms": raw.steady_ms,
                    "tps": raw.steady_tps, "iteration_ms": raw.steady_iteration_ms, "tau": raw.steady_tau},
            occupancy=raw.occupancy,
            totals=raw.totals if spec_on else {}, counts=raw.counts if spec_on else [],
            margins=raw.margins, pit=raw.pit if decode.record_pit else [], drafter=decode.drafter if spec_on else "",
            drafter_options=dict(decode.drafter_options) if spec_on else {},
            draft_p_min=decode.draft_p_min if spec_on else 0.0,
            prefill_tokens=raw.prefill_tokens, kv_prompt_cells=raw.kv_prompt_cells)

    def prompt_logits(self, tokens) -> np.ndarray:
        """Target logits after feeding `tokens` to a cleared cache (sequence 0)."""
        return self._core.prompt_logits(_token_ids(tokens, "tokens"))

    def pending_logits(self, seq: int) -> np.ndarray:
        """Target logits for sequence `seq`'s last generated token on top of the KV cache the last
        generate() left (which stays unchanged): shows whether rollback left it consistent."""
        return self._core.pending_logits(_c_int(seq, "seq"))



def build_info() -> dict:
    """llama.cpp commit, build flags, backend and llama.cpp's system info line."""
    return dict(_core.build_info())


def quantize(src, dst, type_name: str, n_threads: int | None = None) -> Path:
    """Quantize a GGUF file with llama.cpp's llama_model_quantize (requantizing allowed)."""
    _check_model_file(src, "source")
    _core.quantize(str(src), str(dst), type_name, int(n_threads or default_threads()))
    return Path(dst)
