"""Initial densities on control volumes, under the path of the first version.

A kept public path (the first version's acceptance checks import ``solvers.initial``): the
names are those of :mod:`solvers.transport`, where the code lives (``_initial``); new code
imports them from there.
"""

from solvers.transport import (
    DensityError,
    cell_averages,
    density_function,
    initial_density,
    random_field,
)

__all__ = ["DensityError", "cell_averages", "density_function", "initial_density", "random_field"]
