"""Quickstart: the transformer PDE on S^2 through the Python API, step by step.

The command line (``transformer-pde run CONFIG.toml``) builds everything below from a config;
this script does the same by hand with the public names of the packages, so that each piece
can be swapped for your own: a mesh (``meshes``), an attention model (``solvers.attention``),
frozen head weights (``solvers.weights``), the finite-volume solver (``solvers.transport``),
the energy-dissipation budget (``solvers.diagnostics``), and an XDMF file for ParaView written
with DOLFINx itself.

The model (docs/model.md, M1): tokens on the sphere S^2 form a probability measure mu_t that
solves d/dt mu + div_S(mu X[mu]) = 0, with the attention velocity of one head Q = K = V = I,

    X[mu](x) = s P_x (int e^{beta <x, y>} y dmu(y)) / (int e^{beta <x, y>} dmu(y)),

P_x = I - x x^T. For s = +1 the tokens ascend the interaction energy
E = (1 / (2 beta)) int int e^{beta <x, y>} dmu dmu at the rate G^2 >= 0 and gather into
clusters; the finite volumes conserve the mass to round-off.

Run (seconds at the default size; serially or under MPI):

    .venv/bin/python docs/examples/api_quickstart.py /tmp/quickstart
    .venv/bin/mpiexec -n 2 .venv/bin/python docs/examples/api_quickstart.py /tmp/quickstart
    .venv/bin/python docs/examples/api_quickstart.py /tmp/q --refinement 4 --t-end 6

The output folder is the first argument (default results/api_quickstart), or the environment
variable ``QUICKSTART_OUT``; the size is ``--refinement`` / ``--t-end`` (or
``QUICKSTART_REFINEMENT`` / ``QUICKSTART_T_END``). It writes ``density.xdmf`` (+ ``.h5``;
open it in ParaView) and prints, on rank 0, the mass, the energy, G^2 and the energy budget at
the final time; the same numbers are left in the dictionary ``result``. The cells marked
``# %%`` can be run one by one in an editor that understands them (VS Code, Spyder,
Jupytext); the settings then come from the environment variables.
"""

# %% [markdown]
# ## Imports
# `dolfinx_solver` must be imported before mpi4py, petsc4py and dolfinx: it selects the PETSc
# build that DOLFINx was compiled against. Everything else is a public name of the project's
# packages (exported by their `__init__`), never a private module.

# %%
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import dolfinx_solver  # noqa: F401  (first: before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import numpy as np

from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head
from solvers.diagnostics import EnergyBudget
from solvers.threads import configure_threads
from solvers.transport import TransportSolver, initial_density
from solvers.weights import make_weights

# %% [markdown]
# ## Settings
# The environment gives the defaults; a command line (when this file is run as a script)
# overrides them. `configure_threads` shares the cores between the MPI ranks and numba's
# threads, as the command line `transformer-pde` does at start-up.

# %%
OUT = Path(os.environ.get("QUICKSTART_OUT", "results/api_quickstart"))
REFINEMENT = int(os.environ.get("QUICKSTART_REFINEMENT", "3"))  # icosphere level: 20 * 4^level
T_END = float(os.environ.get("QUICKSTART_T_END", "1.0"))
BETA = 4.0  # inverse temperature
SIGN = +1  # +1: tokens ascend the energy (attention ODE); -1: they descend it

if __name__ == "__main__" and Path(sys.argv[0]).name == Path(__file__).name:
    parser = argparse.ArgumentParser(description="The transformer PDE on S^2 via the Python API.")
    parser.add_argument("out", nargs="?", default=str(OUT), help="output folder")
    parser.add_argument("--refinement", type=int, default=REFINEMENT, help="icosphere level")
    parser.add_argument("--t-end", type=float, default=T_END, help="final time")
    args = parser.parse_args()
    OUT, REFINEMENT, T_END = Path(args.out), args.refinement, args.t_end

configure_threads()
comm = MPI.COMM_WORLD
if comm.rank == 0:
    OUT.mkdir(parents=True, exist_ok=True)
comm.barrier()

# %% [markdown]
# ## 1. The mesh and its control volumes
# An icosphere distributed over the ranks: each rank owns some triangles and sees one layer of
# ghost cells across its facets. `control_volumes` computes the finite-volume geometry on the
# sphere itself (exact spherical areas, great-circle facets and their normals). On every rank
# the cells `0 .. cv.n_owned - 1` are the owned ones.

# %%
mesh = icosphere(comm, REFINEMENT)
cv = control_volumes(mesh)
quality = mesh_quality(cv)

# %% [markdown]
# ## 2. The model: attention and head weights
# One head (Q, K, V) = (I, I, I) with inverse temperature beta and sign s. `make_weights`
# with "frozen" keeps the head constant in time; "ou" and "oscillating" make it evolve (see
# configs/s2_ou.toml and configs/s2_oscillating.toml). `manifold=True`: tokens live on the
# sphere, and the velocity is projected onto its tangent planes by P_x.

# %%
eye = np.eye(3)
attention = Attention(BETA, SIGN, manifold=True)
weights = make_weights("frozen", [Head(eye, eye, eye)])

# %% [markdown]
# ## 3. Initial data and the solver
# `initial_density` takes a numpy expression in x[0], x[1], x[2] (parsed and checked, never
# passed to eval), averages it over each owned cell and normalises the mass to 1: two smooth
# bumps, around the north pole and around x = e_1. The solver is second-order MUSCL with
# SSP-RK3, the time step chosen from the CFL number at every step.

# %%
density0 = initial_density(cv, "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3")
solver = TransportSolver(cv, attention, weights, density0, reconstruction="muscl", cfl=0.4)
diag0 = solver.diagnostics()

# %% [markdown]
# ## 4. Time stepping, with the energy budget
# `solver.step(T_END)` takes one CFL step, never past T_END, and lands on it exactly. The
# `EnergyBudget` is given the measure (cell centres, cell masses) after every step and
# integrates each term of E(T) - E(0) = int d_tE dt + int D dt in time (d_tE = 0 for frozen
# weights, and the token dissipation D = s G^2 for one head). Every call is collective.

# %%
budget = EnergyBudget()
budget.record(solver.t, *solver.measure(), weights, attention, comm)
while solver.t < T_END:
    solver.step(T_END)
    budget.record(solver.t, *solver.measure(), weights, attention, comm)

# %% [markdown]
# ## 5. Diagnostics
# `diagnostics()` is collective and gives the same numbers on every rank: the mass, the
# interaction energy E, G^2 and the token dissipation D. `budget.columns()` has the budget
# since t = 0 (dE, int_G2, int_dissipation, edi_residual = dE - int d_tE - int D, ...).

# %%
diag = solver.diagnostics()
edi = budget.columns()
min_density = comm.allreduce(float(solver.density.min(initial=np.inf)), op=MPI.MIN)

# %% [markdown]
# ## 6. An XDMF file with DOLFINx
# The density is constant on each cell: a DG0 function. DOLFINx numbers its degrees of
# freedom itself, so each owned cell's value goes through the dofmap, and the ghost values
# are then updated from their owners. `XDMFFile` writes the mesh once and the function at
# time t (density.xdmf + density.h5), collectively, on any number of ranks.

# %%
V = dolfinx.fem.functionspace(mesh, ("DG", 0))
rho = dolfinx.fem.Function(V, name="density")
rho.x.array[V.dofmap.list[: cv.n_owned, 0]] = solver.density
rho.x.scatter_forward()
xdmf = OUT / "density.xdmf"
with dolfinx.io.XDMFFile(comm, str(xdmf), "w") as f:
    f.write_mesh(mesh)
    f.write_function(rho, solver.t)

# %% [markdown]
# ## 7. Report
# The mass is 1 to round-off; the energy grows (s = +1: the tokens gather), and the budget
# residual dE - int D is the discretisation error of the scheme (it shrinks as the mesh is
# refined).

# %%
result = {
    "t": solver.t,
    "steps": solver.steps,
    "cells": quality.n_cells,
    "mass": diag.mass,
    "energy0": diag0.energy,
    "energy": diag.energy,
    "G2": diag.G2,
    "min_density": min_density,
    "dE": edi["dE"],
    "int_G2": edi["int_G2"],
    "int_dissipation": edi["int_dissipation"],
    "edi_residual": edi["edi_residual"],
    "xdmf": str(xdmf),
}
if comm.rank == 0:
    print(
        f"S^2, {quality.n_cells} cells on {comm.size} rank(s), beta = {BETA}: "
        f"t = {solver.t:g} after {solver.steps} steps"
    )
    print(f"mass     = {diag.mass:.16f}  (|mass - 1| = {abs(diag.mass - 1):.1e})")
    print(f"energy   = {diag0.energy:.6f} -> {diag.energy:.6f}  (G^2 = {diag.G2:.6f})")
    print(
        f"budget   : dE = {edi['dE']:.6f}, int D = {edi['int_dissipation']:.6f}, "
        f"residual = {edi['edi_residual']:.2e}"
    )
    print(f"density  : min {min_density:.3e}, written to {xdmf}", flush=True)
