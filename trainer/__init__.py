"""The gin-configured job runner: `train`, `eval` and `infer` on sharded `jax.jit`, optax, orbax.

Modules: `train`/`eval`/`infer` (library functions + thin gin entry points), `jobs` (validate,
build, compile), `steps` (train/eval steps), `models` (the gin-configured `ModelSpec`; wrappers
and families live in `modeling`), `partitioning` (the mesh),
`optimizers`, `schedules`, `checkpoints`, `metrics` (run outputs), `data` (seqio wiring),
`validation`, `gin_entry` (flags -> gin). Nothing is imported here.
"""
