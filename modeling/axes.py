"""Logical axis names, declared once, and the one mapping of them onto the device mesh.

Models name every parameter and activation dimension with these logical names (T5X's vocabulary);
`logical_axis_rules()` says which mesh axis, if any, each name is sharded over. Other packages
(`t5_jax`, `trainer`) import the names from here instead of repeating string literals.

The mesh has three axes, `MESH_AXES = ("data", "fsdp", "model")`:

- `data`: pure data parallelism (parameters replicated);
- `fsdp`: data parallelism whose parameters and optimizer state are sharded along `embed`
  (ZeRO-3 / fully sharded data parallel);
- `model`: tensor (Megatron) parallelism over `heads`, `mlp` and `vocab`.
"""

from __future__ import annotations

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
VOCAB = "vocab"
JOINED_KV = "joined_kv"
LAYERS = "layers"

ALL_AXES: tuple[str, ...] = (BATCH, LENGTH, EMBED, MLP, HEADS, KV, VOCAB, JOINED_KV, LAYERS)

DATA = "data"
FSDP = "fsdp"
MODEL = "model"
MESH_AXES: tuple[str, str, str] = (DATA, FSDP, MODEL)

# Common shapes of activations, so modules do not repeat tuple literals.
ACT_EMBED: tuple[str, ...] = (BATCH, LENGTH, EMBED)
ACT_HEADS: tuple[str, ...] = (BATCH, LENGTH, HEADS, KV)
ACT_MLP: tuple[str, ...] = (BATCH, LENGTH, MLP)
ACT_VOCAB: tuple[str, ...] = (BATCH, LENGTH, VOCAB)


def logical_axis_rules() -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """Returns the (logical name, mesh axes) rules, in flax's priority order.

    Flax assigns rules top to bottom and never uses a mesh axis twice within one array, so the
    order matters: `batch` claims `data` and `fsdp` first, which leaves activations' `embed`
    unsharded, while parameters (which have no `batch` dimension) get `embed` sharded over `fsdp`.
    `heads`, `mlp`, `vocab` and `joined_kv` are split over `model`; `length`, `kv` and `layers`
    are never split.

    Use with `flax.linen.logical_axis_rules(logical_axis_rules())` (activation constraints) and
    `flax.linen.logical_to_mesh_sharding(..., rules=logical_axis_rules())` (parameter shardings).
    """
    return (
        (BATCH, (DATA, FSDP)),
        (VOCAB, MODEL),
        (MLP, MODEL),
        (HEADS, MODEL),
        (JOINED_KV, MODEL),
        (EMBED, FSDP),
        (KV, None),
        (LENGTH, None),
        (LAYERS, None),
    )
