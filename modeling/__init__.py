"""Model pieces shared by every family and owned by none (the layer below `llama_jax`, `t5_jax`).

Modules: `axes` (logical axis names and the mesh rules), `remat` (rematerialisation policies),
`decoding` (model-agnostic greedy and beam search), `attention` (the attention seam `attend` and
its kernel registry: `xla`, `cudnn`, `splash`, `auto`). Nothing is imported here.
"""
