"""Model pieces shared by every family and owned by none (the layer below `llama_jax`, `t5_jax`).

Modules: `axes` (logical axis names and the mesh rules), `remat` (rematerialisation policies),
`attention` (the attention seam and its kernel registry), `decoding` (model-agnostic greedy and
beam search), `models` (what the trainer sees of a model: loss, scores, decoding, counts),
`family` (the model-family protocol and its lazy registry). Nothing is imported here.
"""
