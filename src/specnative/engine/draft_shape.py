"""What a speculative round drafts: a chain of k tokens, or a tree verified in one batch.

Spellings (the sweep's --draft-shape, generate(draft_shape=...)):

* ``chain``: k tokens in a line (the sweep's --k decides k).
* ``tree:topk=4,depth=5,budget=8``: EAGLE-2's dynamic tree, as SGLang drafts it
  (--speculative-eagle-topk, --speculative-num-steps, --speculative-num-draft-tokens): every
  expanded node gets ``topk`` children, the ``topk`` nodes of largest cumulative draft probability
  of each depth are expanded, ``depth`` levels, and the ``budget`` best nodes are verified.
* ``tree:branches=4,p_split=0.1,budget=8``: llama.cpp's examples/speculative (llama-speculative
  -np 4 --draft-p-split 0.1 --draft-max 8): a branch splits when a further candidate's draft
  probability exceeds ``p_split``, at most ``branches`` branches, drafting stops once the tree
  holds ``budget`` nodes.

The budget is the verify budget: a tree of budget B and a chain of k = B put the same number of
positions through the target per round (B + 1 with the pending token).
"""
from __future__ import annotations

from dataclasses import dataclass

from specnative import _core

TREE_DRAFTERS = ("model", "eagle3")  # drafters that draft trees: the draft model and an EAGLE-3 head
TOPK_KEYS = ("topk", "depth", "budget")
SPLIT_KEYS = ("branches", "p_split", "budget")
TOPK_DEFAULTS = {"topk": 4, "depth": 5, "budget": 8}  # SGLang's EAGLE defaults
SPLIT_DEFAULTS = {"branches": 4, "p_split": 0.1, "budget": 8}  # llama.cpp's -np 4, --draft-p-split 0.1


@dataclass(frozen=True)
class DraftShape:
    """A chain (kind "chain") or a tree (kind "topk" or "split") and its numbers."""

    kind: str = "chain"
    topk: int = 0
    depth: int = 0
    budget: int = 0
    branches: int = 0
    p_split: float = 0.0

    @property
    def is_tree(self) -> bool:
        return self.kind != "chain"

    @property
    def spelling(self) -> str:
        """The one spelling of this shape (parse(spelling) == self)."""
        if self.kind == "topk":
            return f"tree:topk={self.topk},depth={self.depth},budget={self.budget}"
        if self.kind == "split":
            return f"tree:branches={self.branches},p_split={self.p_split:g},budget={self.budget}"
        return "chain"

    def __str__(self) -> str:
        return self.spelling

    @property
    def ids_per_sequence(self) -> int:
        """KV sequence ids one sequence's tree uses (one per branch): the engine needs
        n_seq_max >= concurrency x this."""
        if self.kind == "topk":
            return max(self.topk, self.budget)
        if self.kind == "split":
            return self.branches
        return 1

    @property
    def cells_per_round(self) -> int:
        """KV cells a tree's round holds beyond the pending token at most (a split tree's last step
        may pass its budget by a branch's siblings; a topk tree's draft feeds up to topk nodes per
        level); 0 for a chain (its k says it)."""
        if self.kind == "topk":
            return max(self.budget, self.topk * self.depth)
        if self.kind == "split":
            return self.budget + self.branches - 1
        return 0

    @property
    def batch_per_sequence(self) -> int:
        """Target or draft batch entries one sequence's round needs at most: the verified nodes and
        the pending token, or a topk draft's frontier."""
        if self.kind == "topk":
            return max(self.budget + 1, self.topk)
        if self.kind == "split":
            return self.budget + self.branches
        return 0

    def core_args(self) -> dict:
        """generate()'s tree_kind and tree arguments of the native core."""
        if self.kind == "topk":
            return {"tree_kind": "topk", "tree": {k: float(getattr(self, k)) for k in TOPK_KEYS}}
        if self.kind == "split":
            return {"tree_kind": "split", "tree": {k: float(getattr(self, k)) for k in SPLIT_KEYS}}
        return {"tree_kind": "none", "tree": {}}

    def fill_core(self, tree) -> None:
        """Sets the native core's TreeShape (GenerateParams.tree) to this shape; a chain leaves it off."""
        if not self.is_tree:
            return
        tree.kind = getattr(_core.TreeKind, self.kind)
        for key in TOPK_KEYS if self.kind == "topk" else SPLIT_KEYS:
            setattr(tree, key, getattr(self, key))


CHAIN = DraftShape()


def _number(key: str, text: str, spelling: str):
    try:
        value = float(text) if key == "p_split" else int(text)
    except ValueError:
        raise ValueError(f"draft shape {spelling!r}: {key} must be {'a number' if key == 'p_split' else 'an integer'}, "
                         f"not {text!r}") from None
    if key == "p_split":
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"draft shape {spelling!r}: p_split must be in [0, 1], not {text}")
    else:
        limit = {"topk": 16, "depth": 64, "budget": 128, "branches": 16}[key]
        if not 1 <= value <= limit:
            raise ValueError(f"draft shape {spelling!r}: {key} must be in [1, {limit}], not {text}")
    return value


def parse(spelling) -> DraftShape:
    """A DraftShape from its spelling (or a DraftShape, or None: the chain). Raises ValueError
    with one line naming what is wrong."""
    if spelling is None:
        return CHAIN
    if isinstance(spelling, DraftShape):
        return spelling
    if not isinstance(spelling, str):
        raise ValueError(f"a draft shape is 'chain' or 'tree:...', not {spelling!r}")
    text = spelling.strip()
    if text == "chain":
        return CHAIN
    if not text.startswith("tree:"):
        raise ValueError(f"draft shape {spelling!r}: use 'chain', 'tree:topk=4,depth=5,budget=8' or "
                         f"'tree:branches=4,p_split=0.1,budget=8'")
    values = {}
    for part in filter(None, (p.strip() for p in text[len("tree:"):].split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in TOPK_KEYS + SPLIT_KEYS:
            raise ValueError(f"draft shape {spelling!r}: {part!r} is not one of "
                             f"{', '.join(k + '=' for k in dict.fromkeys(TOPK_KEYS + SPLIT_KEYS))}")
        if key in values:
            raise ValueError(f"draft shape {spelling!r}: {key} is given twice")
        values[key] = _number(key, value.strip(), spelling)
    topk_style = bool({"topk", "depth"} & values.keys())
    split_style = bool({"branches", "p_split"} & values.keys())
    if topk_style and split_style:
        raise ValueError(f"draft shape {spelling!r} mixes the topk/depth shape with the branches/p_split one")
    if not (topk_style or split_style):
        raise ValueError(f"draft shape {spelling!r}: give topk/depth (EAGLE-2, SGLang) or branches/p_split "
                         f"(llama.cpp's examples/speculative)")
    if topk_style:
        return DraftShape("topk", **{**TOPK_DEFAULTS, **values})
    return DraftShape("split", **{**SPLIT_DEFAULTS, **values})


def parse_list(text: str) -> list[DraftShape]:
    """The sweep's --draft-shape: shapes separated by ';' or by ',' before 'chain'/'tree:'."""
    shapes, current = [], []
    for piece in text.split(","):
        head = piece.strip()
        if (head == "chain" or head.startswith("tree:")) and current:
            shapes.append(",".join(current))
            current = []
        current.append(piece)
    if current:
        shapes.append(",".join(current))
    out = []
    for group in shapes:
        for spelled in group.split(";"):
            if spelled.strip():
                out.append(parse(spelled))
    if not out:
        raise ValueError("--draft-shape needs at least one shape")
    if len(set(out)) != len(out):
        raise ValueError(f"--draft-shape {text!r} names a shape twice")
    return out
