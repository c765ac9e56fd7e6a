"""Shared fixtures: tiny generated models (written once per test session) and engines."""
from __future__ import annotations

import os
import sys
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from specnative import Engine
from specnative.models import tiny_pair

PROMPTS = ["The city of", "Once upon a time there was a", "Hello"]
# One thread: robust on a shared 2-core machine. SPECNATIVE_TEST_NGL=-1 runs the suite with every
# layer offloaded to the GPU (bench/gpu_check.sh).
TEST_NGL = int(os.environ.get("SPECNATIVE_TEST_NGL", "0"))
ENGINE_KW = {"n_threads": 1, "n_gpu_layers": TEST_NGL}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def projection_models(tmp_path_factory):
    """A tiny target (pt.gguf, 4 layers) and draft (pd.gguf, 2 layers) for the projection's tests."""
    from specnative.models.tiny import write_tiny_llama
    d = tmp_path_factory.mktemp("projection-models")
    write_tiny_llama(d / "pt.gguf", n_embd=64, n_ff=128, n_layer=4)
    write_tiny_llama(d / "pd.gguf", n_embd=64, n_ff=128, n_layer=2)
    return d


@pytest.fixture(scope="session")
def copy_pair(model_dir):
    """Target and an exact copy as draft: every draft token must be accepted."""
    return tiny_pair(model_dir, "copy")


@pytest.fixture(scope="session")
def noisy_pair(model_dir):
    """Draft = target + 3 % weight noise: accepts some drafts, rejects others."""
    return tiny_pair(model_dir, "noisy", noise=0.03)


@pytest.fixture(scope="session")
def noisy_engine(noisy_pair):
    target, draft = noisy_pair
    with Engine(target, draft, n_ctx=4096, n_batch=256, n_seq_max=8, **ENGINE_KW) as engine:
        yield engine


@pytest.fixture(scope="session")
def target_only(noisy_pair):
    """The noisy pair's target without a draft model: the n-gram drafters need none."""
    with Engine(noisy_pair[0], n_ctx=4096, n_batch=256, n_seq_max=2, **ENGINE_KW) as engine:
        yield engine


@pytest.fixture(scope="session")
def copy_engine(copy_pair):
    target, draft = copy_pair
    with Engine(target, draft, n_ctx=2048, n_batch=256, n_seq_max=4, **ENGINE_KW) as engine:
        yield engine


def assert_lossless_verdict(engine, prompts, base_tokens, other_tokens, temperature=0.0, seed=0, k=4, drafter=""):
    """Outputs that batch-shape noise may part (a verify batch vs 1-token steps, or sequences decoded
    alone vs together): llama.cpp's logits differ in the last bits between shapes, and how much
    depends on the CPU (CI runs on Intel and AMD hosts), so a near-tie one host keeps can flip on
    another. Such tests assert the lossless verdict, exact or numeric, never fail; strict token
    equality stays where the shapes are the same (a repeat, the batch-invariant build). The noise
    control compares 1-token steps with k+1-token chunks; for outputs parted by the number of rows
    per decode (alone vs together, prefill chunk sizes) k=1 stands for it: 1 row vs several is the
    kernel switch that moves the bits."""
    from specnative import lossless

    control = lossless.measure_noise(engine, prompts, base_tokens, k, drafter,  # a hidden drafter's settings too
                                     temperature=temperature, seed=seed)
    verdict = lossless.judge(engine, prompts, base_tokens, other_tokens, temperature, seed, control)
    assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason
    return verdict


# --- checks shared by several test files -----------------------------------------------------------
# A speculative run's step buckets: disjoint phases of one clock (csrc/core/phase_clock.h).
SPEC_PARTS = ("prefill_target", "prefill_draft", "draft", "draft_ingest", "verify", "resample", "policy")


def check_counts(result, k: int) -> None:
    """The invariants every speculative run's exact counts obey, per sequence and in total, with any
    drafter (draft lengths 0..k, rounds without a draft) and any rule."""
    for c, tokens in zip(result.counts, result.tokens):
        assert c["emitted"] == len(tokens) - 1                              # the first token is prefill's
        assert c["rounds"] - (c["emitted"] - c["accepted"]) in (0, 1)        # a correction/bonus a round, but
        #                                                                     after a final accepted EOG draft
        assert c["drafted"] == c["drafted_at"].sum() <= k * c["rounds"]
        assert c["accepted"] == c["accepted_at"].sum()
        assert c["accepted"] + c["rejected"] <= c["drafted"]                 # a rejection ends the round
        assert c["accept_len_hist"].sum() == c["rounds"]
        assert (c["accept_len_hist"] * np.arange(k + 1)).sum() == c["accepted"]
        assert np.all(np.diff(c["drafted_at"]) <= 0)                        # a draft of length L: positions 1..L
        assert np.all(np.diff(c["accepted_at"]) <= 0)                       # accepted only after all earlier ones
        assert np.all(c["accepted_at"] <= c["drafted_at"]) and c["drafted_at"][0] <= c["rounds"]
    for key in ("drafted", "accepted", "rejected", "rounds", "emitted"):
        assert result.totals[key] == sum(c[key] for c in result.counts), key
    assert result.totals["emitted"] == result.decode_tokens


def check_spec_timers(result) -> None:
    """A speculative run's step timers: non-negative buckets that account for its wall time, and the
    round time the sweep uses."""
    t = result.times
    assert all(t[p] >= 0 for p in SPEC_PARTS) and t["decode"] == 0
    assert t["draft"] > 0 and t["verify"] > 0
    parts = sum(t[p] for p in SPEC_PARTS)
    assert 0.99 * t["total"] <= parts <= 1.0001 * t["total"]  # only the clock's own calls are left out
    assert 0 <= t["policy_startup"] <= t["policy"]
    assert result.round_ms == pytest.approx((t["draft"] + t["draft_ingest"] + t["verify"] + t["resample"]
                                             + t["policy"] - t["policy_startup"]) / result.steps)


@contextmanager
def injected(engine, fault: str):
    """A planted C++ fault (csrc bindings: _inject_fault) for the calls inside the block; the engine
    is clean again afterwards, whatever happened."""
    engine._core._inject_fault(fault)
    try:
        yield engine
    finally:
        engine._core._inject_fault("none")


class _WatchedCore:
    """engine._core with one method wrapped: `entered` is set just before the native call,
    `left` as it returns or raises."""

    def __init__(self, core, method: str, entered, left):
        self._core, self._method, self._entered, self._left = core, method, entered, left

    def __getattr__(self, name):
        attribute = getattr(self._core, name)
        if name != self._method:
            return attribute

        def watched(*args, **kwargs):
            self._entered.set()
            try:
                return attribute(*args, **kwargs)
            finally:
                self._left.set()
        return watched


@contextmanager
def native_call_events(engine, method: str = "generate"):
    """Events around the engine's native `method`: yields (entered, left). The switch interval is
    raised far beyond any call for the block, so Python never takes the GIL from a running thread:
    another thread woken by `entered` runs only once the calling thread has released the GIL,
    which it does inside the native call (bindings: `locked`). An event, not a sleep: what such a
    thread does happens during the call on any machine, loaded or not."""
    entered, left = threading.Event(), threading.Event()
    core, interval = engine._core, sys.getswitchinterval()
    engine._core = _WatchedCore(core, method, entered, left)
    sys.setswitchinterval(1000.0)
    try:
        yield entered, left
    finally:
        sys.setswitchinterval(interval)
        engine._core = core


@contextmanager
def inside_native_call(engine, method: str = "generate"):
    """Yields an event set from inside the main thread's next native `method` call, once that call
    runs: a SIGUSR1 handler sets it, and Python runs signal handlers there only where the call polls
    for Ctrl-C (bindings: python_interrupt_pending), i.e. past its start checks. The signal is sent
    once the call has released the GIL (native_call_events), so the handler cannot run in Python
    before the call. For a close() from another thread that must find the call running."""
    import signal

    inside = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda *args: inside.set())
    try:
        with native_call_events(engine, method) as (entered, _):
            sender = threading.Thread(target=lambda: (entered.wait(), os.kill(os.getpid(), signal.SIGUSR1)),
                                      daemon=True)
            sender.start()
            yield inside
            sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)


class FakeIndex:
    """Stands in for `pip download`: for (package, version) it writes that wheel into dest, holding
    the module's __init__.py and the given members (path -> bytes). Records every call; a package
    it does not serve fails the test."""

    def __init__(self, wheels: dict):
        self.wheels, self.calls = wheels, []  # {(package, version): (module, {member: data})}

    def __call__(self, package: str, version: str, dest) -> None:
        self.calls.append((package, version))
        if (package, version) not in self.wheels:
            pytest.fail(f"no wheel for {package}=={version} in the fake index")
        module, members = self.wheels[package, version]
        with zipfile.ZipFile(Path(dest) / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{module}/__init__.py", "")
            for member, data in members.items():
                wheel.writestr(member, data)


def refuse_download(*args):
    """A download function for what must be served from the cache."""
    pytest.fail("must not download: the file is cached")


@pytest.fixture
def no_figure_files(monkeypatch):
    """Reports that draw no figure files: for tests that read summary.md's text alone (saving a
    figure as PNG and PDF costs a second or two on 2 cores; test_report checks the figures).
    summary.md still names every figure."""
    import matplotlib.pyplot as plt

    from specnative.report import summary

    def not_saved(fig, stem):
        plt.close(fig)
        return [Path(stem).with_suffix(".png"), Path(stem).with_suffix(".pdf")]

    monkeypatch.setattr(summary, "save", not_saved)


def assert_real_figure(path) -> None:
    """A written figure that holds a drawing: a PNG decodes to an image drawn on more than 1 % of it;
    a PDF has its header, a page and its end marker."""
    path = Path(path)
    if path.suffix == ".png":
        from matplotlib import image

        pixels = image.imread(path)
        assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 100, pixels.shape
        drawn = np.any(pixels != pixels[0, 0], axis=2)  # pixels other than the corner's background
        assert drawn.mean() > 0.01, f"{path}: a blank image"
    else:
        data = path.read_bytes()
        assert data.startswith(b"%PDF-") and b"/Type /Page" in data and data.rstrip().endswith(b"%%EOF"), path
