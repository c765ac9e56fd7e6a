"""train-drafter --kind dflash: the DFlash drafter made, trained and written on the EAGLE-3 pipeline's data.

Everything before this (the target's checks, the prompts, the self-distilled sequences with their
features and soft labels, the held-out split, the draft vocabulary) is pipeline.py's, shared with
EAGLE-3, and so are the training loop (loop.py) and the file's writer (writer.py); this picks the
mask token and builds the drafter and its training recipe.
"""
from __future__ import annotations

import numpy as np

from .dflash_head import DFlashConfig, make_dflash_head
from .dflash_trainer import DFlashSettings
from .layers import from_target


def choose_mask_token(reader, sequences) -> int:
    """The token of the block's masked positions: llama.cpp embeds it with the target's own row, so it
    should be one the text never uses. The highest-id control token that is not a role of the
    tokenizer (bos, eos, eot, pad) and never occurs in `sequences`; else the unknown token; else the
    rarest token of the data (highest id on ties)."""
    import gguf

    types = reader.get_field("tokenizer.ggml.token_type")
    kinds = np.asarray(types.contents() if types is not None else [], dtype=np.int64)
    roles = set()
    for key in ("bos", "eos", "eot", "padding", "eom"):
        field = reader.get_field(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            roles.add(int(field.contents()))
    n_vocab = len(kinds)
    seen = np.zeros(max(n_vocab, 1), dtype=np.int64)
    for s in sequences:
        np.add.at(seen, np.asarray(s.tokens)[np.asarray(s.tokens) < n_vocab], 1)
    control = [i for i in np.flatnonzero(kinds == int(gguf.TokenType.CONTROL)) if i not in roles and seen[i] == 0]
    if control:
        return int(control[-1])
    unknown = np.flatnonzero(kinds == int(gguf.TokenType.UNKNOWN))
    if len(unknown):
        return int(unknown[0])
    return int(np.lexsort((-np.arange(len(seen)), seen))[0])


def new_dflash(o, info, weights: dict, d2t, layers, mask_token: int):
    """The seeded, untrained drafter: the target's width and attention shape, o.draft_layers layers, the
    target's output rows of the draft vocabulary and final norm, its token embeddings borrowed."""
    tok_embd, output, output_norm = from_target(weights, d2t)
    cfg = DFlashConfig(n_embd=info.n_embd, n_layer=o.draft_layers, n_head=info.n_head, n_head_kv=info.n_head_kv,
                       n_ff=info.n_ff, n_feat=len(layers), n_draft_vocab=info.n_vocab if d2t is None else len(d2t),
                       block_size=o.block_size, mask_token=mask_token, rope_base=info.rope_base, rms_eps=info.rms_eps)
    return make_dflash_head(cfg, tok_embd, output, o.seed, output_norm=output_norm)


def setup_dflash(o, *, info, layers, reader, weights, d2t, train_set, held_set, row_len: int, deadline, **_):
    """(the seeded drafter, its training recipe, the report's extras) of --kind dflash."""
    mask = choose_mask_token(reader, train_set[0] + held_set[0])
    head = new_dflash(o, info, weights, d2t, layers, mask)
    recipe = DFlashSettings(seed=o.seed, lr=o.lr, rows_per_batch=o.batch_rows, row_len=row_len, gamma=o.gamma,
                            max_tokens=o.max_tokens, deadline=deadline, epochs=o.epochs, quiet=o.quiet)
    extra = {"block_size": o.block_size, "draft_layers": o.draft_layers, "mask_token": mask,
             "loss_weights": f"exp(-(i - 1) / {o.gamma:g}) at block offset i",
             "block_lengths": f"{min(recipe.min_block, o.block_size)}..{o.block_size}, one per batch",
             "block_tokens_per_row": recipe.block_tokens, "rows_per_batch": recipe.rows_per_batch}
    return head, recipe, extra
