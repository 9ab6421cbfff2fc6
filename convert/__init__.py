"""Published checkpoints in and out of xlscale, beside the trainer and above the model families.

Modules: `hf_checkpoints` (Hugging Face / Meta LLaMA -> orbax, orbax -> Hugging Face),
`hf_cache` (`INIT_CHECKPOINT='hf:<dir>'`, converted once and cached), `safetensors_files`
(numpy safetensors I/O), `grown_init` (an `INIT_CHECKPOINT` grown to an extended vocabulary),
`init_checkpoints` (params-only orbax steps, `'<dir>[@step]'`, `params_hash`). `trainer` imports
this package; nothing here imports `trainer`. Nothing is imported here.
"""
