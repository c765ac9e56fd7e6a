"""A target split across rpc-server processes on loopback (llama.cpp's RPC backend, CPU devices):
output under the lossless verdict against the local run, exact counts, timers that add up; bad
placements and unreachable servers are clear errors, without a hang."""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import PROMPTS, check_counts, check_spec_timers

from specnative import Engine, _core, lossless
from specnative.engine import rpc_device_names
from specnative.engine.rpc_servers import find_rpc_server, local_rpc_servers
from specnative.record import schema
from specnative.sweep import SweepConfig, run_sweep
from specnative.sweep import main as sweep_main

BINARY, HOW = find_rpc_server()
needs_rpc = pytest.mark.skipif(not _core.supports_rpc() or BINARY is None,
                               reason="this build has no RPC backend (SPECNATIVE_RPC=OFF)"
                               if not _core.supports_rpc() else HOW)
KW = dict(n_ctx=1024, n_batch=256, n_seq_max=4, n_threads=1)
K = 3


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two rpc-servers on 127.0.0.1, stopped at the end of the module whatever happens."""
    if not _core.supports_rpc() or BINARY is None:
        pytest.skip("no RPC backend or rpc-server binary")
    with local_rpc_servers(2, BINARY, log_dir=tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def local_runs(noisy_pair):
    target, draft = noisy_pair
    with Engine(target, draft, **KW) as local:
        base = local.generate(PROMPTS, n_predict=24)
        spec = local.generate(PROMPTS, n_predict=24, spec=True, k=K)
    return base, spec


# Where a test compares RPC and local runs token for token: the servers run this build's CPU backend
# with one thread (local_rpc_servers), as the local engine does (n_threads=1), on the same batches
# and the tiny models' F32 weights (no repacked layout on either side). The same kernels compute
# the same bits; only where they run differs.
SAME_ARITHMETIC = "CPU backend, one thread, same batches on both sides"


@needs_rpc
def test_target_across_two_servers_is_lossless_against_the_local_run(noisy_pair, servers, local_runs):
    target, draft = noisy_pair
    local_base, local_spec = local_runs
    with Engine(target, draft, **KW, n_gpu_layers=-1, rpc_servers=servers, split_mode="layer",
                tensor_split=[1, 1], draft_devices="none", n_gpu_layers_draft=0) as remote:
        names = rpc_device_names(servers)
        assert len(names) == len(set(names)) == 2 and all(n.startswith("RPC") for n in names)
        base = remote.generate(PROMPTS, n_predict=24)
        spec = remote.generate(PROMPTS, n_predict=24, spec=True, k=K)
        control = lossless.measure_noise(remote, PROMPTS, local_base.tokens, K)
        for tokens in (base.tokens, spec.tokens):
            verdict = lossless.judge(remote, PROMPTS, local_base.tokens, tokens, 0.0, 0, control)
            assert verdict.lossless_ok, verdict.reason
    check_counts(spec, K)
    check_spec_timers(spec)  # network waits are charged to a step
    # SAME_ARITHMETIC: the same tokens, and the same drafts accepted
    assert [list(t) for t in spec.tokens] == [list(t) for t in local_spec.tokens]
    assert spec.totals["accepted"] == local_spec.totals["accepted"]


@needs_rpc
def test_target_on_one_named_server_device(noisy_pair, servers, local_runs):
    target, draft = noisy_pair
    with Engine(target, **KW, rpc_servers=servers[:1]) as listed:  # adds the server, offloads nothing (-ngl 0)
        local = listed.generate(PROMPTS, n_predict=24)
    # all on the local CPU: the local run itself, bit for bit (the same engine settings and batches)
    assert [list(t) for t in local.tokens] == [list(t) for t in local_runs[0].tokens]
    (name,) = rpc_device_names(servers[:1])
    with Engine(target, draft, **KW, n_gpu_layers=-1, rpc_servers=servers[:1], split_mode="none",
                devices=[name], draft_devices="none") as remote:
        base = remote.generate(PROMPTS, n_predict=24)
        control = lossless.measure_noise(remote, PROMPTS, local_runs[0].tokens, K)
        verdict = lossless.judge(remote, PROMPTS, local_runs[0].tokens, base.tokens, 0.0, 0, control)
        assert verdict.lossless_ok, verdict.reason


@needs_rpc
def test_sweep_over_rpc_tags_its_rows_and_counts_as_locally(noisy_pair, servers, tmp_path):
    target, draft = noisy_pair
    frames = {}
    for name, layers, placement in [("local", 0, {}),
                                    ("rpc", -1, {"rpc_servers": servers, "draft_devices": ["none"]})]:
        cfg = SweepConfig(targets=[target], draft=draft, ctx_lens=[0], concurrencies=[2], ks=[2], n_predict=6,
                          warmup=0, repeats=1, max_repeats=1, threads=1, gpu_layers=layers, out_dir=tmp_path / name,
                          report=False, placement=placement)
        frames[name] = schema.read_traces(run_sweep(cfg))
    assert set(frames["rpc"]["backend"]) == {"CPU ngl=-1 rpc=2"}
    same = ["cell_id", "drafted", "accepted", "rejected", "emitted", "first_divergence", "verdict"]
    assert frames["rpc"][same].equals(frames["local"][same])  # SAME_ARITHMETIC


@needs_rpc
def test_models_still_load_after_the_servers_have_gone(noisy_pair, tmp_path):
    """RPC devices stay registered for the process after their servers stop; nothing that loads a
    model later (a vocabulary for the workloads, an Engine on the defaults) may ask them for memory,
    which aborts in ggml. A fresh interpreter, so an abort fails this test and not the suite."""
    target, draft = noisy_pair
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from specnative import Engine, _core
        from specnative.engine.rpc_servers import local_rpc_servers
        from specnative.run.workloads import Workload
        with local_rpc_servers(1, {str(BINARY)!r}, log_dir=Path({str(tmp_path)!r})) as endpoints:
            with Engine({str(target)!r}, n_gpu_layers=-1, rpc_servers=endpoints, n_ctx=256, n_threads=1) as e:
                e.generate(["Hello"], n_predict=2)
        Workload({str(target)!r})
        with Engine({str(target)!r}, {str(draft)!r}, n_ctx=256, n_threads=1) as e:
            print(len(e.generate(["Hello"], n_predict=3, spec=True, k=2).tokens[0]))
        """)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.split() == ["3"]


def test_unreachable_server_is_a_clear_error_without_a_hang(noisy_pair):
    if not _core.supports_rpc():
        with pytest.raises(ValueError, match="no RPC backend"):
            Engine(noisy_pair[0], rpc_servers=["127.0.0.1:1"], **KW)
        return
    with socket.socket() as bound:  # a port that is taken but not listening: connection refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with pytest.raises(ValueError, match=rf"127.0.0.1:{port} cannot be reached"):
            Engine(noisy_pair[0], rpc_servers=[f"127.0.0.1:{port}"], rpc_timeout_s=2, **KW)
    with pytest.raises(ValueError, match="cannot resolve host"):
        Engine(noisy_pair[0], rpc_servers=["no-such-host.invalid:50052"], rpc_timeout_s=2, **KW)


def test_sweep_refuses_rpc_flags_before_any_work(tmp_path):
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{bound.getsockname()[1]}"
        expected = "cannot be reached" if _core.supports_rpc() else "no RPC backend"
        with pytest.raises(SystemExit, match=expected):
            sweep_main(["-ngl", "-1", "--rpc", endpoint, "-o", str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="--rpc needs -ngl"):
        sweep_main(["--rpc", endpoint, "-o", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(split_mode="rows"), "split_mode must be one of"),
    (dict(tensor_split=[1, -1]), "tensor_split"),
    (dict(tensor_split="a,b"), "tensor_split must be numbers"),
    (dict(tensor_split=[1.0] * 1000), "tensor_split has 1000 entries"),
    (dict(devices=["NoSuchGPU0"]), "unknown offload device 'NoSuchGPU0'"),
    (dict(devices=["CPU"]), "unknown offload device 'CPU'"),
    (dict(draft_devices=["NoSuchGPU0"]), "unknown offload device"),
    (dict(main_gpu=-2), "main_gpu"),
    (dict(rpc_servers=["localhost"]), "not host:port"),
    (dict(rpc_servers=["127.0.0.1:99999"]), "not host:port"),
    (dict(rpc_timeout_s=0), "rpc_timeout_s"),
])
def test_bad_placements_are_value_errors(noisy_pair, kwargs, message):
    target, draft = noisy_pair
    with pytest.raises(ValueError, match=message):
        Engine(target, draft, **KW, **kwargs)
