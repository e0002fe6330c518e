"""The one-layer training problem shared by the training tests (not a test module).

Tokens on the interval [0, 4] with a Gaussian bump at 1 (every velocity > 0, so the map
rho -> mu_T is affine), one head on R^1 parameterised by theta in [-1, 1], a Gaussian initial
law of theta: :class:`solvers.training.MeanFieldTraining` over one layer (``n_steps = 1``).
"""

from __future__ import annotations

from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention
from solvers.training import MeanFieldTraining
from solvers.transport import initial_density


def one_layer(
    comm: Any,
    heads: Any,
    loss: Any,
    prefix: str,
    *,
    cells: int,
    theta_cells: int,
    ds: float,
    t_end: float = 0.03,
    kappa: float = 0.01,
    weight_decay: float = 0.01,
    theta_width: float = 0.4,
) -> MeanFieldTraining:
    """The problem with ``cells`` token cells, ``theta_cells`` parameter cells, the initial
    law of theta ~ exp(-theta^2 / (2 theta_width^2)) and the training's own parameters."""
    cv = flat_control_volumes(box(comm, [cells], [0.0], [4.0]))
    rho = initial_density(cv, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return MeanFieldTraining(
        cv,
        Attention(1.0, 1, manifold=False),
        rho,
        heads,
        box(MPI.COMM_SELF, [theta_cells], [-1.0], [1.0]),
        t_end=t_end,
        n_steps=1,
        loss=loss,
        kappa=kappa,
        weight_decay=weight_decay,
        ds=ds,
        density=lambda c: np.exp(-0.5 * (c[:, 0] / theta_width) ** 2),
        petsc_options_prefix=prefix,
    )
