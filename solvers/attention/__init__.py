"""Multi-head softmax attention: the nonlocal velocity of the transformer PDE, by quadrature.

Public face of the attention package (docs/model.md, M1). :class:`Attention` (beta, sign, backend)
evaluates, for heads :class:`Head` ``(Q, K, V)`` and a measure given by quadrature points and
masses, the partition functions Z_h, the softmax means and the velocity
X = s (1/H) sum_h P_x V_h mean_h; :func:`measure_diagnostics` gives the energy, G^2 and the
token dissipation of a distributed measure, a :class:`Measure` (this rank's points and masses,
the communicator and the sources the kernel sums run over: one object that every diagnostic
of a state takes). With ``velocity_model="gradient"`` the velocity is
instead the b-weighted Wasserstein gradient s grad(dE/dmu)/b of the interaction energy
(:meth:`Attention.energy_gradient`, :class:`EnergyGradient`; :func:`velocity_mismatch` says
when the two differ). The sums are brute force (compiled numba kernel,
log-sum-exp stabilised, in blocks), a low-rank expansion with an a-priori error bound, or
certified spectral sums on S^1/S^2 at any beta, chosen per head (backend "auto").

Modules: ``_attention`` (Head, Attention, kernel_sums), ``_measure`` (measure_diagnostics,
gather_measure), ``_token_measure`` (:class:`Measure`), ``_checks`` (input validation), ``_gradient`` (the energy gradient,
the mobility b and the gradient velocity), ``_kernels`` (brute-force kernel sums),
the subpackages :mod:`solvers.attention.lowrank` (the low-rank expansion: plans, bounds, cost
model, monomial features, sphere basis evaluation) and :mod:`solvers.attention.spectral` (the
certified spectral sums at any beta: Funk-Hecke series, bounds, transforms), ``_choice`` (per
head the cheapest method, :class:`HeadChoice` in ``_head_choice``),
:mod:`solvers.attention.sphere_basis` (orthonormal polynomial bases and exact
quadratures on S^1 and S^2, also used by the JKO Hessian), ``_distributed`` (kernel sums of a
distributed measure without gathering it: :class:`DistributedSources`, the one interface the
schemes and diagnostics use), ``_sources`` (:class:`GlobalSources`: distributed sources of a
mesh, plus gathering accessors for callers that need the whole measure).
"""

from solvers.attention import sphere_basis
from solvers.attention._attention import (
    BACKENDS,
    DEFAULT_TOLERANCE,
    Attention,
    AttentionField,
    Head,
    kernel_sums,
    kernel_sums_with_choice,
)
from solvers.attention._distributed import (
    DistributedSources,
    KernelSums,
    clear_reuse,
    distributed_kernel_sums,
    merge_partial_sums,
    resolve_sources,
    ring_pass,
)
from solvers.attention._gradient import (
    VELOCITY_MODELS,
    EnergyGradient,
    energy_gradient_from_sums,
    velocity_mismatch,
)
from solvers.attention._head_choice import HeadChoice
from solvers.attention._kernels import HAVE_NUMBA
from solvers.attention._measure import (
    MeasureDiagnostics,
    gather_measure,
    measure_diagnostics,
    measure_sums,
)
from solvers.attention._sources import GlobalSources
from solvers.attention._token_measure import Measure, as_measure

__all__ = [
    "BACKENDS",
    "DEFAULT_TOLERANCE",
    "HAVE_NUMBA",
    "VELOCITY_MODELS",
    "Attention",
    "AttentionField",
    "DistributedSources",
    "EnergyGradient",
    "GlobalSources",
    "Head",
    "HeadChoice",
    "KernelSums",
    "Measure",
    "MeasureDiagnostics",
    "as_measure",
    "clear_reuse",
    "distributed_kernel_sums",
    "gather_measure",
    "kernel_sums",
    "energy_gradient_from_sums",
    "kernel_sums_with_choice",
    "measure_diagnostics",
    "measure_sums",
    "merge_partial_sums",
    "resolve_sources",
    "ring_pass",
    "sphere_basis",
    "velocity_mismatch",
]
