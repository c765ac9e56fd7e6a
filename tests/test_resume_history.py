"""--resume and the run directory: a refused resume changes no file (the header and
every other check come before any repair), prompts, context and --check-k are compared by
content, the provenance keeps every invocation's history, and one model given twice is refused."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_sweep_safety import argv_for, finished_run, fresh_copy, no_engine  # noqa: F401  (fixture)

from specnative.record import schema
from specnative.run import model_checks
from specnative.sweep import main


def snapshot(directory) -> dict:
    """Every file under `directory` by name and sha256 (and every folder): what must not change."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(Path(directory).rglob("*"))}


def refused_unchanged(argv, directory, match: str) -> str:
    """Runs the sweep, which must refuse with `match` and leave `directory` byte for byte as it was."""
    before = snapshot(directory)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert match in str(exc.value.code), exc.value.code
    assert snapshot(directory) == before
    return str(exc.value.code)


def _edit_lines(path: Path, edit) -> None:
    lines = path.read_bytes().split(b"\r\n")[:-1]
    path.write_bytes(b"".join(edit(line) + b"\r\n" for line in lines))


# --- another header, with a torn last row, is refused before any repair ------------------
@pytest.mark.parametrize("edit", [lambda line: line.rsplit(b",", 1)[0],   # a column removed
                                  lambda line: line + b",note"])          # a column added
def test_a_resume_on_another_header_refuses_before_any_repair(noisy_pair, finished_run, tmp_path,  # noqa: F811
                                                               monkeypatch, edit):
    out = fresh_copy(finished_run, tmp_path)
    traces = out / "traces.csv"
    _edit_lines(traces, edit)
    traces.write_bytes(traces.read_bytes()[:-25])  # and a torn last row
    rows = traces.read_bytes().count(b"\n")
    no_engine(monkeypatch)
    for _ in range(3):  # each retry used to delete one more row before refusing
        refused_unchanged(argv_for(noisy_pair, out, "--resume"), out, "another header")
    assert traces.read_bytes().count(b"\n") == rows


def test_a_torn_row_is_counted_against_the_files_own_header(finished_run, tmp_path):  # noqa: F811
    from specnative.record import rundir
    out = fresh_copy(finished_run, tmp_path)
    data = (out / "traces.csv").read_bytes()
    plan = rundir.plan_resume(out / "traces.csv", {})
    assert plan.keep_bytes is None and len(plan.rows) == data.count(b"\n") - 1
    (out / "traces.csv").write_bytes(data[:-30])
    plan = rundir.plan_resume(out / "traces.csv", {})
    assert plan.keep_bytes == data[:-1].rfind(b"\n") + 1  # just the torn row, nothing else
    assert (out / "traces.csv").read_bytes() == data[:-30]  # planning changes nothing


# --- every refusal of --resume leaves the run directory byte for byte ------------------------------
def test_every_refused_resume_leaves_every_file_byte_identical(noisy_pair, copy_pair, finished_run,  # noqa: F811
                                                               tmp_path, monkeypatch):
    out = fresh_copy(finished_run, tmp_path)
    data = (out / "traces.csv").read_bytes()
    (out / "traces.csv").write_bytes(data[:-30])  # a torn last row that a resume would repair
    target, draft = noisy_pair
    no_engine(monkeypatch)
    cases = [
        (argv_for(noisy_pair, out, "--resume", "-s", "3"), "settings differ"),
        (argv_for((target, copy_pair[1]), out, "--resume"), "draft_sha256"),
        (argv_for(noisy_pair, out, "--resume", "--ci-width", "nan"), "--ci-width"),
    ]
    for argv, match in cases:
        refused_unchanged(argv, out, match)
    # a damaged row before the last
    lines = data.split(b"\r\n")
    lines[1] = lines[1][:40]
    (out / "traces.csv").write_bytes(b"\r\n".join(lines)[:-30])
    refused_unchanged(argv_for(noisy_pair, out, "--resume"), out, "damaged row")
    (out / "traces.csv").write_bytes(data[:-30])
    # a provenance.json that is unreadable, then one that is missing
    prov = (out / "provenance.json").read_bytes()
    (out / "provenance.json").write_bytes(prov[:20])
    refused_unchanged(argv_for(noisy_pair, out, "--resume"), out, "unreadable")
    (out / "provenance.json").unlink()
    refused_unchanged(argv_for(noisy_pair, out, "--resume"), out, "provenance.json is missing")
    (out / "provenance.json").write_bytes(prov)
    # a model problem found after the settings matched: the torn row is still not repaired
    monkeypatch.setattr(model_checks, "vocab_model", lambda path, role: (_ for _ in ()).throw(
        SystemExit(f"error: {role} {path}: cannot generate with it")))
    refused_unchanged(argv_for(noisy_pair, out, "--resume"), out, "cannot generate")


# --- prompts and context by content, --check-k recorded -----------------------------------
def files_argv(pair, files: Path, out: Path) -> list[str]:
    return argv_for(pair, out, "--prompts", str(files / "prompts.txt"), "--context", str(files / "context.txt"),
                    "-np", "1")


@pytest.fixture(scope="module")
def files_run(noisy_pair, tmp_path_factory) -> Path:
    """A finished run that read a --prompts and a --context file (measured once for the module; the
    files stay where the run recorded them, tests resume copies of its run directory)."""
    root = tmp_path_factory.mktemp("files-run")
    (root / "prompts.txt").write_text("Tell me about the sea.\nWrite a short poem about rain.\n")
    (root / "context.txt").write_text("The harbour was quiet that morning. " * 40)
    assert main(files_argv(noisy_pair, root, root / "run")) == 0
    return root


def resume_argv(pair, files_run: Path, tmp_path: Path) -> list[str]:
    """A copy of the finished run directory under tmp_path; the command line that resumes it."""
    shutil.copytree(files_run / "run", tmp_path / "run")
    return files_argv(pair, files_run, tmp_path / "run") + ["--resume"]


@pytest.mark.parametrize("name, change, recorded", [
    ("prompts.txt", "Tell me about the sea.\nWrite a long poem about snow.\n", "settings.prompts_sha256"),
    ("context.txt", "An entirely different document. " * 40, "settings.context_sha256"),
])
def test_a_resume_after_editing_a_file_at_the_same_path_is_refused(noisy_pair, files_run, tmp_path, monkeypatch,
                                                                    name, change, recorded):
    argv = resume_argv(noisy_pair, files_run, tmp_path)
    no_engine(monkeypatch)
    original = (files_run / name).read_text()
    (files_run / name).write_text(change)  # the same path, other content
    try:
        message = refused_unchanged(argv, tmp_path / "run", "settings differ")
    finally:
        (files_run / name).write_text(original)
    assert recorded in message and "prompts_source" not in message


def test_check_k_is_recorded_and_a_change_refused(noisy_pair, files_run, tmp_path, monkeypatch):
    argv = resume_argv(noisy_pair, files_run, tmp_path)
    assert json.loads((tmp_path / "run" / "provenance.json").read_text())["settings"]["check_k"] is False
    no_engine(monkeypatch)
    refused_unchanged(argv + ["--check-k"], tmp_path / "run", "settings.check_k: recorded False, now True")


# --- the provenance history ---------------------------------------------------------------------
def test_a_resume_keeps_the_runs_history_and_every_cells_records(noisy_pair, finished_run, tmp_path):  # noqa: F811
    out = fresh_copy(finished_run, tmp_path)
    first = json.loads((out / "provenance.json").read_text())
    lines = (out / "traces.csv").read_bytes().split(b"\r\n")
    (out / "traces.csv").write_bytes(b"\r\n".join(lines[:-3] + [b""]))  # the last cell is measured again
    assert main(argv_for(noisy_pair, out, "--resume")) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert (prov["run_id"], prov["command"], prov["date"]) == (first["run_id"], first["command"], first["date"])
    assert [i["run_id"] for i in prov["invocations"]][0] == first["run_id"] and len(prov["invocations"]) == 2
    frame = schema.read_traces(out / "traces.csv")
    assert set(frame["run_id"]) == {i["run_id"] for i in prov["invocations"]}
    on_rows = int((frame["spec_decode"] == "on").sum())
    assert sum(entry["cells"] for entry in prov["noise_control"].values()) == on_rows  # every cell, not the last
    assert prov["workload"] == first["workload"] and prov["models"] == first["models"]
    # and a third invocation (nothing left to measure) appends itself, keeping the rest
    assert main(argv_for(noisy_pair, out, "--resume")) == 0
    third = json.loads((out / "provenance.json").read_text())
    assert third["invocations"][:2] == prov["invocations"] and len(third["invocations"]) == 3
    counts = lambda record: {name: (e["cells"], e["positions"], e["flips"], e["verdicts"])  # noqa: E731
                             for name, e in record["noise_control"].items()}
    assert counts(third) == counts(prov)  # (rebuilt from traces.csv: its values at the file's 6 digits)


# --- one model given twice under two names ------------------------------------------------------
def test_the_same_model_under_two_paths_is_refused_before_loading(noisy_pair, tmp_path, monkeypatch):
    copy = tmp_path / "copy-of-target.gguf"
    shutil.copyfile(noisy_pair[0], copy)
    no_engine(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(argv_for(noisy_pair, tmp_path / "out") + ["-m", str(copy)])
    assert "same content" in str(exc.value.code) and str(copy) in str(exc.value.code)
    assert not (tmp_path / "out").exists()
