"""llama_jax."""
