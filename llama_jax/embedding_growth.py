"""Growing a LLaMA2 parameter tree to an extended vocabulary (`pipelines.vocab_extend`).

Two matrices have a vocabulary axis: `token_embedder/embedding [vocab, embed]` and
`lm_head/kernel [embed, vocab]` (untied). Growing them to `new_vocab_size`:

- every row (column of `lm_head`) of the old table is copied bit for bit, so the old tokens'
  embeddings and their logits are what they were;
- the row of a new piece is initialised by an `INIT_METHODS` entry:
  `"subword_mean"` (default): the mean of the rows of the old tokens the piece splits into under
  the OLD tokenizer (`pipelines.vocab_extend.old_ids_of_new_pieces`), the usual choice: the new
  piece starts where the model already places its spelling;
  `"mean"`: the mean of all rows of the base vocabulary (Hewitt 2021's documented alternative,
  which keeps the initial output distribution close to the old one);
- remaining rows beyond the old table (padding up to `new_vocab_size`) get the mean of the base
  vocabulary's rows.

When the old table is larger than the base tokenizer (padding ids, as the tiny configs' 512 for a
320-piece vocabulary), new pieces take ids right after the base tokenizer's and so replace padding
rows, which no token ever used; ids below `base_size` are never touched.

Means are taken in float64 and cast to the table's dtype. Pure numpy on host arrays: a 7B model's
tables (32000 × 4096) grow in well under a second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

EMBEDDING = ("token_embedder", "embedding")  # [vocab, embed]
LM_HEAD = ("lm_head", "kernel")  # [embed, vocab]


def _subword_mean(table: np.ndarray, old_ids: Sequence[int], base_size: int) -> np.ndarray:
    del base_size
    return table[np.asarray(old_ids, np.int64)].astype(np.float64).mean(axis=0)


def _all_mean(table: np.ndarray, old_ids: Sequence[int], base_size: int) -> np.ndarray:
    del old_ids
    return table[:base_size].astype(np.float64).mean(axis=0)


# name -> (rows [vocab, embed], old ids of the new piece, base size) -> the new row.
INIT_METHODS: dict[str, Callable[[np.ndarray, Sequence[int], int], np.ndarray]] = {
    "subword_mean": _subword_mean,
    "mean": _all_mean,
}


def grow_rows(
    table: np.ndarray,
    *,
    new_vocab_size: int,
    base_size: int,
    new_pieces: Mapping[int, Sequence[int]],
    method: str = "subword_mean",
) -> np.ndarray:
    """A `[vocab, embed]` table grown to `new_vocab_size` rows (see the module docstring).

    Args:
      table: the old rows, `[old_vocab, embed]` with `old_vocab >= base_size`.
      new_vocab_size: rows of the result (>= the old table and > every new id).
      base_size: the base tokenizer's size; rows below it are copied unchanged.
      new_pieces: new id -> the old ids its string splits into under the old tokenizer.
      method: a key of `INIT_METHODS`.

    Raises:
      ValueError: an unknown method, a new id below `base_size` or beyond the table, an old id
        outside the base vocabulary, a piece without old ids, or a table smaller than the base.
    """
    if method not in INIT_METHODS:
        raise ValueError(f"unknown init method {method!r}; allowed: {sorted(INIT_METHODS)}")
    old_vocab = table.shape[0]
    if old_vocab < base_size:
        raise ValueError(
            f"the checkpoint's vocabulary has {old_vocab} rows, fewer than the base tokenizer's "
            f"{base_size} pieces: it was not trained with that tokenizer"
        )
    if new_vocab_size < old_vocab:
        raise ValueError(f"new_vocab_size {new_vocab_size} < the old table's {old_vocab} rows")
    for new_id, old_ids in new_pieces.items():
        if not base_size <= new_id < new_vocab_size:
            raise ValueError(
                f"new piece id {new_id} is outside [{base_size}, {new_vocab_size}): new pieces "
                "come after the base tokenizer's ids and inside the grown table"
            )
        if not old_ids or not all(0 <= i < base_size for i in old_ids):
            raise ValueError(
                f"new piece {new_id}: old ids {list(old_ids)} must be a non-empty list of ids "
                f"below the base size {base_size}"
            )
    init = INIT_METHODS[method]
    grown = np.empty((new_vocab_size, *table.shape[1:]), table.dtype)
    grown[:old_vocab] = table
    if new_vocab_size > old_vocab:
        grown[old_vocab:] = _all_mean(table, (), base_size).astype(table.dtype)
    for new_id, old_ids in new_pieces.items():
        grown[new_id] = init(table, old_ids, base_size).astype(table.dtype)
    return grown


def _get(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: Mapping[str, Any], path: Sequence[str], value: Any) -> dict[str, Any]:
    out = dict(tree)
    out[path[0]] = value if len(path) == 1 else _set(tree[path[0]], path[1:], value)
    return out


def vocab_rows(params: Mapping[str, Any]) -> int:
    """The vocabulary size of a LLaMA2 params tree (rows of `token_embedder/embedding`)."""
    return int(np.shape(_get(params, EMBEDDING))[0])


def grow_params(
    params: Mapping[str, Any],
    *,
    new_vocab_size: int,
    base_size: int,
    new_pieces: Mapping[int, Sequence[int]],
    method: str = "subword_mean",
) -> dict[str, Any]:
    """`params` (a LLaMA2 `params` tree) with `token_embedder/embedding` and `lm_head/kernel`
    grown to `new_vocab_size` (`grow_rows`); every other leaf is the same object.

    Returns:
      A new tree of host arrays for the two grown leaves; the input is not modified.
    """
    if "lm_head" in params and vocab_rows(params) != np.shape(_get(params, LM_HEAD))[1]:
        raise ValueError(
            f"token_embedder has {vocab_rows(params)} rows but lm_head "
            f"{np.shape(_get(params, LM_HEAD))[1]} columns"
        )
    kwargs = dict(
        new_vocab_size=new_vocab_size, base_size=base_size, new_pieces=new_pieces, method=method
    )
    out = _set(params, EMBEDDING, grow_rows(np.asarray(_get(params, EMBEDDING)), **kwargs))
    if "lm_head" in params:
        head = np.asarray(_get(params, LM_HEAD))
        out = _set(out, LM_HEAD, np.ascontiguousarray(grow_rows(head.T, **kwargs).T))
    return out
