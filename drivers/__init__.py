"""transformer-pde."""
