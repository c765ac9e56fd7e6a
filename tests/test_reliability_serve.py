"""`specnative serve` holds what the closed loop holds: the same refusals before anything is loaded
or written (training context, --max-kv-gib, hidden-state drafters, bad traces, flags it would not
apply), the same lossless judgement at every temperature and rule, the same recovery of a torn
run folder; a --trace run records what the trace holds."""
from __future__ import annotations

import json
import math
import re

import pytest
from conftest import injected

from specnative.cli import main
from specnative.record import schema
from specnative.serving import arrivals, checks
from specnative.serving.arrivals import Request

QUICK = ["--max-concurrency", "2", "-r", "1", "-k", "3", "-t", "1", "--no-report"]
LEVELS = ["--request-rate", "inf", "--num-requests", "4", "-n", "6"]


def serve_args(pair, out, *extra, levels=LEVELS):
    target, draft = pair
    return ["serve", "-m", str(target), "-md", str(draft), *levels, *QUICK, "-o", str(out), *extra]


def refused(argv, match: str) -> str:
    """The run is refused with one error line (SystemExit) that matches."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    text = str(info.value.code)
    assert text.startswith("error: ") and re.search(match, text), text
    return text


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- refusals before anything is loaded or written ---------------------------------------------------
def test_requests_past_the_training_context_are_refused_up_front(noisy_pair, tmp_path):
    out = tmp_path / "out"
    refused(serve_args(noisy_pair, out, levels=["--request-rate", "inf", "--num-requests", "2", "-n", "200000"]),
            r"the longest request's prompt \+ output length \+ k \+ 1 = \d+ exceeds the models' training context 131072")
    assert not out.exists()


def test_max_kv_gib_is_applied(noisy_pair, tmp_path):
    out = tmp_path / "out"
    refused(serve_args(noisy_pair, out, "--max-kv-gib", "0.001"), r"KV caches would take [\d.e-]+ GiB, over "
                                                                   r"--max-kv-gib 0.001")
    assert not out.exists()


@pytest.mark.parametrize("drafter", ["dflash", "draft-eagle3", "mtp"])
def test_hidden_state_drafters_are_refused_before_anything_is_loaded_while_serve_cannot_run_them(
        noisy_pair, tmp_path, monkeypatch, drafter):
    """One predicate (checks.SERVE_RUNS_HIDDEN_DRAFTERS) decides; while it says no, the refusal is
    one line naming the drafter, before any model is loaded or any file written."""
    monkeypatch.setattr(checks, "SERVE_RUNS_HIDDEN_DRAFTERS", False)
    out = tmp_path / "out"
    name = drafter.removeprefix("draft-")
    refused(serve_args(noisy_pair, out, "--drafter", drafter),
            f"--drafter {name}: serve does not run the hidden-state drafters")
    assert not out.exists()
    assert checks.hidden_drafter_refusal("model") is None and checks.hidden_drafter_refusal("ngram-simple") is None
    monkeypatch.setattr(checks, "SERVE_RUNS_HIDDEN_DRAFTERS", True)
    assert checks.hidden_drafter_refusal(name) is None


def test_shard_stays_refused(noisy_pair, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(serve_args(noisy_pair, tmp_path / "out", "--shard", "0/2"))
    assert info.value.code == 2 and "unrecognized arguments: --shard" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, match", [
    (["--max-concurrency", "257"], r"--max-concurrency must be in \[1, 256\]"),
    (["--request-rate", "1e-300"], r"--request-rate 1e-300: 4 requests would arrive over about 3e\+300 s"),
    (["--drafter-file", "dflash=missing.gguf"], "--drafter-file dflash=missing.gguf: no such file"),
])
def test_bad_serving_flags_are_one_line(noisy_pair, tmp_path, extra, match):
    out = tmp_path / "out"
    refused(serve_args(noisy_pair, out, *extra), match)
    assert not out.exists()


def test_a_drafter_file_that_is_a_directory_is_one_line(noisy_pair, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    refused(serve_args(noisy_pair, tmp_path / "out", "--drafter-file", f"dflash={folder}"), "is a directory")
    from specnative.sweep import main as sweep_main
    with pytest.raises(SystemExit, match="is a directory, not a model file"):
        sweep_main(["-m", str(noisy_pair[0]), "--drafter", "dflash", "--drafter-file", f"dflash={folder}",
                    "-o", str(tmp_path / "sweep")])


BAD_TRACES = {
    "huge id": ('{"arrival_s": 0, "prompt": [1, 99999999999999999999999], "output_len": 3}\n',
                r"trace.jsonl:1: token id 99999999999999999999999 is not a vocabulary index"),
    "outside the vocabulary": ('{"arrival_s": 0, "prompt": [1, 5000], "output_len": 3}\n',
                               "request 0 has token id 5000 outside the target's vocabulary of 1024 tokens"),
    "not text": (b"\xff\xfe\x00", "not UTF-8 text"),
    "a day away": (('{"arrival_s": 0, "prompt": [1], "output_len": 3}\n'
                    '{"arrival_s": 1e9, "prompt": [1], "output_len": 3}\n'), "arrivals spread over 1e\\+09 s"),
    "past the context": ('{"arrival_s": 0, "prompt": [1], "output_len": 300000}\n', "training context"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_trace_files_are_one_line_before_anything_is_written(noisy_pair, tmp_path, case):
    content, match = BAD_TRACES[case]
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    refused(serve_args(noisy_pair, out, "--trace", str(trace), levels=[]), match)
    assert not out.exists()


def test_a_trace_folder_is_one_line(noisy_pair, tmp_path):
    refused(serve_args(noisy_pair, tmp_path / "out", "--trace", str(tmp_path), levels=[]), "is a directory")


# ---- every flag applied and recorded, or refused -------------------------------------------------------
def flags_of(parser) -> set:
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_each_verb_refuses_the_other_verbs_flags(noisy_pair, tmp_path, capsys):
    from specnative.serving import cli as serve_cli
    from specnative.sweep import cli as sweep_cli
    sweep_flags, serve_flags = flags_of(sweep_cli.build_parser()), flags_of(serve_cli.build_parser())
    sweep_only, serve_only = sweep_flags - serve_flags, serve_flags - sweep_flags
    assert {"--context", "--shard", "--dist-positions", "--which-k"} <= sweep_only
    assert {"--ctx-len", "--prefix-cache"} <= sweep_flags & serve_flags  # one shared prefix per level in serve
    assert "-np" in sweep_flags & serve_flags  # llama-server's slots: the concurrency grid in sweep, one count in serve
    assert {"--request-rate", "--trace", "--slo", "--max-concurrency"} <= serve_only
    store_true = {s for a in sweep_cli.build_parser()._actions + serve_cli.build_parser()._actions
                  for s in a.option_strings if a.nargs == 0}
    out = tmp_path / "out"
    for verb, flags in (("serve", sweep_only), ("sweep", serve_only)):
        for flag in sorted(flags):
            value = [] if flag in store_true else ["1"]
            argv = ["-m", str(noisy_pair[0]), "-md", str(noisy_pair[1]), flag, *value, "-o", str(out)]
            with pytest.raises(SystemExit) as info:
                main([verb, *argv])
            assert info.value.code == 2, f"{verb} {flag}: {info.value.code}"
            assert not out.exists(), f"{verb} {flag} wrote {out}"
    capsys.readouterr()


@pytest.mark.parametrize("extra", [["-n", "5"], ["--request-rate", "2"], ["--num-requests", "3"],
                                   ["--burstiness", "0.5"], ["--tasks", "code"]])
def test_flags_a_trace_replaces_are_refused_beside_it(noisy_pair, tmp_path, extra):
    trace = arrivals.write_trace(tmp_path / "t.jsonl", [Request(0.0, (1, 2), 3)])
    refused(serve_args(noisy_pair, tmp_path / "out", "--trace", str(trace), *extra, levels=[]),
            "--trace replays the file's own arrivals, prompts and output lengths: .* would not apply")


def test_a_trace_run_prints_and_records_what_the_trace_holds(noisy_engine, noisy_pair, tmp_path, capsys):
    prompt = tuple(noisy_engine.tokenize("The city of").tolist())
    trace = arrivals.write_trace(tmp_path / "t.jsonl", [Request(0.0, prompt, 3), Request(0.01, prompt, 5),
                                                        Request(0.02, prompt, 7)])
    out = tmp_path / "out"
    assert main(serve_args(noisy_pair, out, "--trace", str(trace), levels=[])) == 0
    err = capsys.readouterr().err
    assert "3 requests arriving over 0.02 s (offered rate 150 req/s), output lengths 3-7" in err
    assert "32 requests" not in err and "rates ['1'" not in err
    rows = schema.read_traces(out / "traces.csv")
    assert (rows["n_predict"] == 7).all() and (rows["n_requests"] == 3).all()
    assert rows["request_rate"].tolist() == pytest.approx([150.0, 150.0])
    record = json.loads((out / "provenance.json").read_text())["serve"]
    assert record["n_requests"] == 3 and record["n_predict"] == 7 and record["request_rate"] == ["150"]
    assert record["burstiness"] is None and record["trace"]["output_len"] == {"min": 3, "max": 7, "mean": 5.0}
    assert [line["output_len"] for line in read_lines(out / "requests.jsonl")] == [3, 5, 7] * 2


# ---- lossless at every temperature and rule -------------------------------------------------------------
def test_a_replay_draws_with_the_keys_it_is_given(noisy_engine):
    """Serving keys a request by its place in the trace; the replay that judges it must draw with
    that key, not with the request's place in the replay call."""
    prompts = [noisy_engine.tokenize(t).tolist() for t in ("Hello", "The city of", "Once upon")]
    seed = 2**63 + 12345
    result = noisy_engine.generate(prompts, n_predict=5, temperature=0.9, seed=seed)
    forced = [list(map(int, t)) for t in result.tokens]
    together = noisy_engine._core.replay(prompts, forced, 0.9, seed)
    for s in range(len(prompts)):  # each alone, keyed as it was keyed together: the same uniforms
        alone = noisy_engine._core.replay([prompts[s]], [forced[s]], 0.9, seed, keys=[s])
        assert alone["u"].tolist() == together["u"][together["seq"] == s].tolist()
    unkeyed = noisy_engine._core.replay([prompts[2]], [forced[2]], 0.9, seed)
    assert unkeyed["u"].tolist() != together["u"][together["seq"] == 2].tolist()  # key 0 draws other numbers
    with pytest.raises(ValueError, match="2 keys for 1 continuations"):
        noisy_engine._core.replay([prompts[0]], [forced[0]], 0.9, seed, keys=[0, 1])


def test_sampled_serving_is_judged_per_seed_and_a_planted_bug_fails(noisy_engine):
    from specnative import lossless
    from specnative.serving.loop import serve
    from specnative.serving.verdict import sampled_serving_verdict
    prompts = [tuple(noisy_engine.tokenize(t).tolist()) for t in ("Hello", "The city of", "Once upon a time")]
    trace = arrivals.build_trace([list(p) for p in prompts], [12, 10, 14], math.inf, 5, seed=3)
    kwargs = {"max_concurrency": 3, "temperature": 0.9, "seed": 11, "virtual_clock": True}
    for spec in (False, True):
        run = serve(noisy_engine, trace, spec=spec, k=3, accept_rule="match", **kwargs)
        verdict = sampled_serving_verdict(noisy_engine, trace, run.tokens, 3, 0.9, 11)
        assert verdict.verdict in (lossless.EXACT, lossless.NUMERIC), verdict.reason
    other_seed = serve(noisy_engine, trace, **dict(kwargs, seed=12))
    assert sampled_serving_verdict(noisy_engine, trace, other_seed.tokens, 3, 0.9, 11).verdict == lossless.FAIL
    with injected(noisy_engine, "rollback_short"):
        bad = serve(noisy_engine, trace, spec=True, k=3, accept_rule="match", **kwargs)
    assert sampled_serving_verdict(noisy_engine, trace, bad.tokens, 3, 0.9, 11).verdict == lossless.FAIL


@pytest.mark.parametrize("rule, on_verdicts, method", [("match", {"exact", "numeric"}, "alone-seed"),
                                                       ("rejection", {"exact-dist"}, "distribution")])
def test_a_sampling_serve_run_gets_the_closed_loops_verdict(noisy_pair, tmp_path, rule, on_verdicts, method):
    out = tmp_path / "out"
    assert main(serve_args(noisy_pair, out, "--temp", "0.8", "--accept-rule", rule)) == 0
    rows = schema.read_traces(out / "traces.csv")
    off, on = rows[rows["spec_decode"] == "off"].iloc[0], rows[rows["spec_decode"] == "on"].iloc[0]
    assert off["lossless_method"] == "alone-seed" and off["verdict"] in ("exact", "numeric")
    assert on["lossless_method"] == method and on["verdict"] in on_verdicts and bool(on["lossless_ok"])
    if rule == "rejection":
        assert on["dist_positions"] >= 4096 and on["proxy_verdict"] in ("exact", "numeric")
        assert "match proxy on the serving loop" in on["verdict_reason"]
    from specnative.serving.report import write_report
    summary = write_report(out).read_text()
    assert f"`{method}`: " in summary  # the report says what was checked


# ---- recovery: a torn run folder is resumed like a sweep's ------------------------------------------------
@pytest.fixture
def finished_serve_run(noisy_pair, tmp_path):
    out = tmp_path / "run"
    argv = serve_args(noisy_pair, out, levels=["--request-rate", "inf,50", "--num-requests", "3", "-n", "5"])
    argv[argv.index("-r") + 1] = "2"
    assert main(argv) == 0
    return out, argv


def test_a_torn_serve_run_is_resumed_and_its_files_agree(finished_serve_run, capsys):
    out, argv = finished_serve_run
    traces, requests = out / "traces.csv", out / "requests.jsonl"
    whole = schema.read_traces(traces)
    data = traces.read_bytes()
    traces.write_bytes(data[:-30])  # the last row torn by a crash: its level lost its on row
    with requests.open("a") as f:
        f.write('{"cell_id": "serve/rate=inf/seed=9/np=2/k=3/model/off", "request": 0')  # a torn line
    with pytest.raises(SystemExit, match="exists; pass --resume"):
        main(argv)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "removed a half-written last row" in err and "removed 1 row(s) of cells that were not complete" in err
    assert "[4/4]" in err and "[1/4]" not in err  # only the torn level was measured again
    rows = schema.read_traces(traces)
    assert len(rows) == len(whole) == 8 and sorted(rows["cell_id"]) == sorted(whole["cell_id"])
    lines = read_lines(requests)
    assert len(lines) == 8 * 3 and {line["cell_id"] for line in lines} == set(rows["cell_id"])
    provenance = json.loads((out / "provenance.json").read_text())
    assert len(provenance["invocations"]) == 2 and provenance["completed"]


def test_a_serve_resume_with_other_settings_is_refused(finished_serve_run):
    out, argv = finished_serve_run
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(SystemExit, match="settings differ"):
        main([*argv, "--resume", "--slo", "ttft:100"])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


# ---- the shared checks these rely on -----------------------------------------------------------------------
def test_dist_positions_has_a_bound(noisy_pair, tmp_path):
    from specnative.sweep import main as sweep_main
    with pytest.raises(SystemExit, match=r"--dist-positions must be in \[1, 1000000\]"):
        sweep_main(["-m", str(noisy_pair[0]), "-md", str(noisy_pair[1]), "--dist-positions", "100000000",
                    "-o", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_draft_temperature_refusals_name_what_is_wrong(noisy_engine):
    with pytest.raises(ValueError, match="applies to the draft model .* drafter 'ngram-simple'"):
        noisy_engine.generate(["Hello"], n_predict=3, temperature=0.8, spec=True, accept_rule="rejection",
                              drafter="ngram-simple", draft_temperature=1.6)
    with pytest.raises(ValueError, match="applies when sampling"):
        noisy_engine.generate(["Hello"], n_predict=3, spec=True, draft_temperature=1.6)


def test_a_cached_public_set_replaced_by_a_folder_is_one_line(tmp_path):
    from pathlib import Path

    from specnative.models.presets import FetchError
    from specnative.run.workloads import public_sets
    source = public_sets.SETS["humaneval"]
    dest = tmp_path / f"{source.package}-{source.version}" / Path(source.member).name
    dest.mkdir(parents=True)
    with pytest.raises(FetchError, match="is a directory where the cached data file"):
        public_sets.data_file(source, cache=tmp_path, download=lambda *a: pytest.fail("downloaded"))
