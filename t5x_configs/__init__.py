"""t5x_configs."""
