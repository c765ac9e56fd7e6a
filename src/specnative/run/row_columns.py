"""Row columns both kinds of run write the same way: a synthetic acceptance row's own columns, a
draft tree's counts (a sweep cell's runs, a serve level's requests)."""
from __future__ import annotations

import math

from specnative.engine import synthetic


SYNTHETIC_REASON = ("synthetic acceptance: drafts kept at random at the requested rates, so the output is not the "
                    "target's; a measurement of what that acceptance would pay, never a lossless result")


SYNTHETIC_RULE = "synthetic"


def synthetic_columns(profile, k: int) -> dict:
    """A synthetic row's own columns: the requested profile (its text, per-position rates at k and
    its per-token alpha; the realised ones are accept_at_pos and token_accept_rate) and its verdict,
    which is neither lossless nor a failure."""
    return {"synthetic_acceptance": profile.text, "synthetic_rates": synthetic.rates_text(profile.rates(k)),
            "synthetic_alpha": profile.alpha(k), "lossless_ok": None, "lossless_method": "synthetic",
            # no acceptance rule judges these drafts: a keyed draw keeps each, and a dropped one is
            # replaced by the target's own token (its argmax at T 0, its keyed sample above)
            "accept_rule": SYNTHETIC_RULE,
            "verdict": "synthetic", "verdict_reason": SYNTHETIC_REASON}


def tree_count_columns(spelling: str, totals: dict) -> dict:
    """A draft tree's shape, nodes per round and acceptance by sibling rank from its summed counts
    (a cell's runs, a serving level's requests)."""
    from specnative.engine import parse_draft_shape

    drafted, rounds = totals["drafted"], totals["rounds"]
    return {"draft_shape": parse_draft_shape(spelling).spelling,
            "nodes_per_round": drafted / rounds if rounds else math.nan,
            "accept_at_rank": ";".join(f"{a / o:.4f}" if o else "" for a, o in
                                       zip(totals["accepted_rank"], totals["offered_rank"]))}
