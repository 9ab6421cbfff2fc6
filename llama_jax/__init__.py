"""Flax (linen) LLaMA2 decoder for the CPT scaling study.

Modules: `config` (`LlamaConfig`), `layers`,
`model` (`Llama`), `sizes` (the paper's Table 4 and small sizes), `counting` (parameters, FLOPs).
Nothing is imported here, so importing one module never pulls in the others' dependencies.
"""
