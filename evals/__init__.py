"""Zero-shot evaluation of xlscale checkpoints through lm-evaluation-harness (the `xlscale`
model, local multiple-choice tasks, the CPT paper's benchmark set)."""
