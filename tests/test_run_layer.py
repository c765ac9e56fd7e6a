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


@pytest.mark.parametrize("folder, other", [
    ("serving", "specnative.sweep"), ("sweep", "specnative.serving"), ("run", "specnative.sweep"),
    ("run", "specnative.serving"), ("run", "specnative.bench_verb"), ("bench_verb", "specnative.sweep"),
    ("bench_verb", "specnative.serving"), ("analysis", "specnative.report")])
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


# --- the sweep's axis table -------------------------------------------------------------------------
def test_cell_ids_are_those_run_folders_already_carry():
    """The cell id is read off the axis table: every id below is one that committed run folders carry,
    so older runs still resume, merge and compare."""
    from specnative.sweep.config import Cell
    sha, target = "ab" * 32, Path("t.gguf")
    assert Cell(target, 8192, 4, 0.0).key(sha, "greedy") == f"{sha[:16]}|ctx8192|c4|T0|greedy|task=mixed"
    assert Cell(target, 0, 1, 0.8, "code").key(sha, "rejection", 4) == \
        f"{sha[:16]}|ctx0|c1|T0.8|rejection|task=code|k4"
    cell = Cell(target, 0, 2, 0.0, "mixed", "ngram-simple", 3, False)
    assert cell.key(sha, "greedy", "tree:topk=2,depth=2,budget=3") == \
        f"{sha[:16]}|ctx0|c2|T0|greedy|task=mixed|drafter=ngram-simple|batch=3|prefix=off|shape=tree:topk=2,depth=2,budget=3"
    assert Cell(target, 0, 1, 0.0, factors=(("draft_p_min", 0.5),)).key(sha, "greedy", 4, "0.3") == \
        f"{sha[:16]}|ctx0|c1|T0|greedy|task=mixed|pmin=0.5|k4|synthetic=0.3"
    # the stop rule, a factor now, keeps the place it had as a cell field: after the drafter, ahead
    # of a public set's batch and the prefix cache; the spec policy's part comes after them all
    both = Cell(target, 0, 1, 0.0, "mixed", "model", 2, False, (("draft_p_min", 0.25), ("spec_policy", "adaptive")))
    assert both.key(sha, "greedy", 4) == \
        f"{sha[:16]}|ctx0|c1|T0|greedy|task=mixed|pmin=0.25|batch=2|prefix=off|spec_policy=adaptive|k4"


def test_every_factor_placed_among_the_cell_axes_follows_one_that_is_in_the_id():
    from specnative.record.factors import FACTORS
    from specnative.sweep import axes
    keyed = {axis.name for axis in axes.CELL_AXES if axis.key}
    assert all(f.key_after in keyed for f in FACTORS if f.key_after is not None)


def test_the_grid_orders_a_placed_factor_where_its_cell_field_was():
    """The order of cells decides a shard's share (i mod N): the stop rule's cells come per drafter
    ahead of the prefix cache's modes, as they did before it was a factor; the policy's innermost."""
    from specnative.sweep import SweepConfig
    from specnative.sweep.grid import cells_of
    cfg = SweepConfig(targets=[Path("t.gguf")], draft=Path("d.gguf"), ctx_lens=[0], concurrencies=[1],
                      drafters=["model", "ngram-simple"], prefix_caches=[True, False],
                      factors={"draft_p_min": [0.0, 0.5], "spec_policy": ["static", "adaptive"]})
    order = [(c.drafter, c.factor("draft_p_min"), c.prefix_cache, c.factor("spec_policy")) for c in cells_of(cfg)]
    assert order == [(d, p, pc, sp) for d in ("model", "ngram-simple") for p in ((0.0, 0.5) if d == "model" else (0.0,))
                     for pc in (True, False) for sp in ("static", "adaptive")]


def test_the_recorded_grid_names_a_later_axis_only_where_the_run_left_its_old_value():
    from specnative.engine import synthetic
    from specnative.sweep import SweepConfig, axes
    cfg = SweepConfig(targets=[Path("t.gguf")], draft=Path("d.gguf"))
    assert axes.grid_record(cfg) == {"ctx_len": [0, 8192, 32768], "concurrency": [1, 4, 8], "k": [4],
                                     "temperature": [0.0], "accept_rule": "greedy", "n_predict": 32,
                                     "task": ["mixed"], "drafter": ["model"]}
    changed = SweepConfig(targets=[Path("t.gguf")], draft=Path("d.gguf"), prefix_caches=[True, False],
                          factors={"draft_p_min": [0.0, 0.5]}, draft_shapes=["chain", "tree:topk=2,depth=2,budget=3"],
                          synthetic=synthetic.parse_profiles("0.5"))
    grid = axes.grid_record(changed)
    assert (grid["prefix_cache"], grid["draft_p_min"], grid["draft_shape"], grid["synthetic_acceptance"]) == \
        (["on", "off"], [0.0, 0.5], ["chain", "tree:topk=2,depth=2,budget=3"], ["0.5"])
