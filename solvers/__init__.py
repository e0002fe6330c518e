"""transformer-pde solvers: attention, weights, transport, particles and their diagnostics."""

from solvers.threads import configure_threads

configure_threads()
