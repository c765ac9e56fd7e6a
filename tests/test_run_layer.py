"""The run layer: sweep/ and serving/ are siblings over run/ (neither imports the other), and both
verbs' configurations are composed from the one RunSpec the shared flags resolve to."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "specnative"


def _imports(folder: str) -> set[str]:
    found = set()
    for path in (PACKAGE / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("folder, other", [("serving", "specnative.sweep"), ("sweep", "specnative.serving"),
                                           ("run", "specnative.sweep"), ("run", "specnative.serving")])
def test_a_verb_imports_nothing_of_its_sibling_nor_the_run_layer_of_either(folder, other):
    assert not {m for m in _imports(folder) if m == other or m.startswith(other + ".")}


def test_both_verbs_compose_their_configuration_from_one_run_spec(noisy_pair, tmp_path):
    from specnative.run import options
    from specnative.serving import cli as serve_cli
    from specnative.sweep import SweepConfig
    from specnative.sweep import cli as sweep_cli
    target, draft = noisy_pair
    common = ["-m", str(target), "-md", str(draft), "-n", "12", "-t", "1", "--seed", "7", "--no-db"]
    argv = [*common, "-o", str(tmp_path / "sweep"), "-k", "3", "-np", "1,2"]
    spec = options.spec_from_args(sweep_cli.build_parser().parse_args(argv), argv, "sweep")
    cfg = SweepConfig.from_spec(spec)
    assert (cfg.targets, cfg.draft, cfg.ks, cfg.concurrencies, cfg.n_predict, cfg.threads, cfg.seed) == \
        ([target], draft, [3], [1, 2], 12, 1, 7)
    assert cfg.command == spec.output.command and cfg.command.startswith("specnative sweep ")
    serve_argv = [*common, "-o", str(tmp_path / "serve"), "-k", "3", "-np", "2"]
    args = serve_cli.build_parser().parse_args(serve_argv)
    args.concurrency = [args.max_concurrency]
    serve = serve_cli.config_from(options.spec_from_args(args, serve_argv, "serve"), args)
    assert (serve.target, serve.draft, serve.k, serve.n_predict, serve.threads, serve.seed, serve.db) == \
        (target, draft, 3, 12, 1, 7, None)
