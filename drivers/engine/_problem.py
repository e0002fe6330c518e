"""From a validated config to the problem a run solves: mesh, model, initial data, scheme.

:func:`build_problem` is the only place where ``[time] scheme`` becomes a scheme: through the
registry of :mod:`solvers.transport` (:func:`solvers.transport.make_scheme`), with the
options of :class:`solvers.transport.SchemeOptions`. With ``[adapt] max_level > 0`` that
scheme runs inside a :class:`solvers.transport.AdaptiveScheme` on a forest mesh
(:func:`adaptive_scheme`; docs/adaptivity.md). Collective over the communicator.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine._config import ConfigError, dimension, head_matrices, mesh_free
from drivers.engine._petsc_options import WEIGHT_LAW_PREFIX
from drivers.engine._resources import check_memory
from meshes import (
    ControlVolumes,
    MeshQuality,
    box,
    circle,
    control_volumes,
    flat_control_volumes,
    flat_quality,
    from_file,
    icosphere,
    mesh_quality,
)
from meshes.adaptive import CircleForest, DistributedSphereForest, SphereForest
from solvers.attention import Attention, Head, velocity_mismatch
from solvers.stepping import TokenScheme
from solvers.transport import (
    AdaptiveScheme,
    AdaptOptions,
    AttentionEnergy,
    DistributedAdaptiveScheme,
    PointCloud,
    SchemeOptions,
    StepControl,
    initial_density,
    make_scheme,
    read_positions,
    scheme_spec,
    uniform_sphere,
    vmf_mixture,
)
from solvers.weights import (
    FokkerPlanckSolver,
    FokkerPlanckWeights,
    ParameterisedHeads,
    WeightDynamics,
    gaussian_density,
    head_weights_at,
    make_weights,
    ou_drift,
)

__all__ = [
    "Problem",
    "build_mesh",
    "build_model",
    "adaptive_scheme",
    "build_problem",
    "feedforward",
    "particle_positions",
    "velocity_record",
]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Problem:
    """What a run solves, built from a validated config (:func:`build_problem`).

    Attributes:
        cfg: the resolved configuration.
        cv: the control volumes of the distributed mesh (of an adaptive run, ``[adapt]``: the
            initial mesh; the scheme's own ``cv`` follows the adaptations); of mesh-free
            particles (``[particles]``) the :class:`~solvers.transport.PointCloud`.
        quality: its size and quality figures (h, area ratio, ...; of a point cloud its
            :class:`~solvers.transport.CloudQuality`).
        attention: beta, sign and the evaluation backend of the heads.
        weights: the heads as functions of time.
        density0: the initial density on the owned cells (mass 1).
        scheme: the token scheme, at t = 0.
    """

    cfg: dict[str, Any]
    cv: ControlVolumes
    quality: MeshQuality
    attention: Attention
    weights: WeightDynamics
    density0: Array
    scheme: TokenScheme


def build_mesh(cfg: dict[str, Any], comm: MPI.Comm) -> ControlVolumes:
    """The control volumes of ``[mesh]``: icosphere, polygon, a file, or a box of R^d."""
    m = cfg["mesh"]
    if m["manifold"] in ("R1", "R2"):
        d = dimension(cfg)
        n = [16 * 2 ** m["refinement"]] * d
        return flat_control_volumes(box(comm, n, m["lower"], m["upper"]))
    if m["file"]:
        mesh = from_file(comm, m["file"], m["manifold"])
    elif m["manifold"] == "S2":
        mesh = icosphere(comm, m["refinement"])
    else:
        mesh = circle(comm, m["refinement"])
    return control_volumes(mesh)


def build_model(cfg: dict[str, Any]) -> tuple[Attention, WeightDynamics]:
    """The attention model of ``[attention]`` and the weights of ``[weights]``."""
    a, w = cfg["attention"], cfg["weights"]
    heads = [Head(Q, K, V) for Q, K, V in head_matrices(cfg)]
    curved = cfg["mesh"]["manifold"] in ("S1", "S2")
    attention = Attention(
        a["beta"],
        a["sign"],
        manifold=curved,
        backend=a["backend"],
        tolerance=a["tolerance"],
        frozen_heads=w["dynamics"] == "frozen",
        # the diagnostics and the energy budget describe the trajectory that was computed
        velocity_model=solved_velocity(cfg),
    )
    if w["dynamics"] == "fokker-planck":
        return attention, _weight_measure(w, heads)
    weights = make_weights(
        w["dynamics"],
        heads,
        init=w["init"],
        seed=w["seed"],
        sigma=w["sigma"],
        dt=w["dt"],
        phases=w["phases"],
    )
    return attention, weights


def _weight_measure(w: dict[str, Any], heads: list[Head]) -> WeightDynamics:
    """Theta_t by the Fokker-Planck solver on a box of R^p (on every rank, COMM_SELF: the
    parameter mesh is small and every rank needs all its heads)."""
    p = w["p"]
    mesh = box(MPI.COMM_SELF, w["cells"], w["lower"], w["upper"])
    fp = FokkerPlanckSolver(
        mesh,
        ou_drift(1.0, np.array(w["centre"])),
        w["sigma"],
        density=lambda c: np.ones(len(c)),
        petsc_options_prefix=WEIGHT_LAW_PREFIX,
    )
    fp.set_density(gaussian_density(fp.cv, w["mean0"], w["std0"] ** 2 * np.eye(p)))
    return FokkerPlanckWeights(fp, ParameterisedHeads(heads[0].V, np.array(w["B"])), dt=w["dt"])


def feedforward(cfg: dict[str, Any]):
    """The feed-forward layer v(x, t) of ``[feedforward]``, or None when it is zero.

    ``activation = "affine"``: v = A x + b (docs/model.md, M3); ``"relu"``: v = max(A x + b, 0)
    componentwise, the same layer as ``GaussianParticles(..., activation="relu")``.
    """
    A = np.array(cfg["feedforward"]["A"], dtype=np.float64)
    b = np.array(cfg["feedforward"]["b"], dtype=np.float64)
    if not A.any() and not b.any():
        return None
    if cfg["feedforward"].get("activation", "affine") == "relu":
        return lambda x, t: np.maximum(x @ A.T + b, 0.0)
    return lambda x, t: x @ A.T + b


def scheme_options(cfg: dict[str, Any]) -> SchemeOptions:
    """The :class:`~solvers.transport.SchemeOptions` of ``[time]`` and ``[transport]``."""
    t = cfg["time"]
    prefix = scheme_spec(t["scheme"]).petsc_options_prefix  # (the options default if none)
    return SchemeOptions(
        dt=t["dt"],
        cfl=t["cfl"],
        rk=t["rk"],
        reconstruction=cfg["transport"]["reconstruction"],
        limiter=cfg["transport"]["limiter"],
        background=feedforward(cfg),
        **({"petsc_options_prefix": prefix} if prefix else {}),
        diffusion=cfg["attention"]["diffusion"],
        diffusion_step=cfg["transport"]["diffusion_step"],
        seed=cfg["weights"]["seed"],
        step_control=StepControl(t["dt_max"] or 100.0 * t["dt"]) if t["adaptive"] else None,
        substep_levels=substep_levels(cfg),
    )


def substep_levels(cfg: dict[str, Any]) -> int:
    """K of the local time steps (``[adapt] local_time_stepping``): the level span
    ``max_level - mesh.refinement`` of the adaptive mesh (a cell of the base level is 2^K
    times wider than one of the finest), or 0 without them."""
    ad = cfg["adapt"]
    if not (ad.get("local_time_stepping") and ad["max_level"] > 0):
        return 0
    return ad["max_level"] - cfg["mesh"]["refinement"]


def build_problem(cfg: dict[str, Any], comm: MPI.Comm) -> Problem:
    """Mesh, model, initial density and scheme of a validated config (collective).

    Raises:
        ConfigError: the run would not fit in memory (:func:`check_memory`), or the scheme
            refuses the data (e.g. JKO with an empty cell).
        MeshError, DensityError: an invalid mesh file or initial density.
    """
    check_memory(cfg, comm)
    attention, weights = build_model(cfg)
    name, options = cfg["time"]["scheme"], scheme_options(cfg)
    expression = cfg["initial"]["density"]

    def build(cv: ControlVolumes, density: Array) -> TokenScheme:
        try:
            return make_scheme(name, cv, attention, weights, density, options)
        except ValueError as exc:  # e.g. the JKO scheme needs rho > 0 everywhere
            raise ConfigError("time.scheme", f"{name}: {exc}") from None

    if mesh_free(cfg):
        cloud = particle_cloud(cfg, comm)
        scheme = build(cloud, cloud.measures)
        return Problem(cfg, cloud, cloud.quality(), attention, weights, scheme.density, scheme)
    if cfg["adapt"]["max_level"] > 0:
        energy = AttentionEnergy(attention, weights)
        scheme: TokenScheme = adaptive_scheme(cfg, comm, build, energy)
        cv, density0 = scheme.cv, scheme.density
    else:
        cv = build_mesh(cfg, comm)
        ini = cfg["initial"]
        density0 = initial_density(cv, expression, ini["noise"], ini["noise_degree"], ini["seed"])
        scheme = build(cv, density0)
    quality = mesh_quality(cv) if cv.curved else flat_quality(cv)
    return Problem(cfg, cv, quality, attention, weights, density0, scheme)


def particle_positions(cfg: dict[str, Any]) -> tuple[Array, float]:
    """The initial (n, d) positions of a mesh-free particle run (``[particles]``), the same on
    every rank, and the largest distance of a file's row from the sphere before projection (0
    for the laws). ``uniform`` and ``vmf`` draw from ``numpy.random.default_rng(seed)``
    (:func:`~solvers.transport.uniform_sphere`, :func:`~solvers.transport.vmf_mixture`)."""
    p = cfg["particles"]
    n, d = p["n"], p["d"]
    if p["initial"] == "file":
        try:
            return read_positions(p["file"], n, d)
        except ValueError as exc:  # changed since the config was validated
            raise ConfigError("particles.file", str(exc)) from None
    rng = np.random.default_rng(p["seed"])
    if p["initial"] == "vmf":
        return vmf_mixture(n, np.array(p["centres"]), np.array(p["kappa"]), p["weights"], rng), 0.0
    return uniform_sphere(n, d, rng), 0.0


#: a file's row farther than this from the unit sphere is projected with a warning
OFF_SPHERE_WARNING = 1e-6


def particle_cloud(cfg: dict[str, Any], comm: MPI.Comm) -> PointCloud:
    """The :class:`~solvers.transport.PointCloud` of ``[particles]`` (masses 1/n; rank r owns
    the r-th block of rows); a warning on rank 0 when a file's rows were off the sphere."""
    points, off = particle_positions(cfg)
    if off > OFF_SPHERE_WARNING and comm.rank == 0:
        print(
            f"[transformer-pde] warning: particles.file: rows off the unit sphere by up to "
            f"{off:.3g} (> {OFF_SPHERE_WARNING:g}): projected onto it",
            file=sys.stderr,
            flush=True,
        )
    n = len(points)
    return PointCloud(comm, points, np.full(n, 1.0 / n))


def adaptive_scheme(
    cfg: dict[str, Any], comm: MPI.Comm, build: Any, energy_model: Any = None
) -> AdaptiveScheme:
    """The scheme of ``[time]`` on the adaptive mesh of ``[adapt]`` (collective): a forest
    from ``mesh.refinement`` to ``adapt.max_level``, adapted to the initial density."""
    m, ad = cfg["mesh"], cfg["adapt"]
    # circumcentred two-point fluxes (the JKO scheme, the noise's diffusion) need a Delaunay
    # mesh: the forest then adds the cells of its Delaunay closure (S2; S1 meshes always are)
    noisy = cfg["attention"]["diffusion"] > 0
    delaunay = scheme_spec(cfg["time"]["scheme"]).delaunay_mesh or noisy
    if ad["forest"] == "distributed":  # S2 (checked): each rank its own leaves
        forest: Any = DistributedSphereForest(comm, m["refinement"], ad["max_level"], delaunay)
    elif m["manifold"] == "S2":
        forest = SphereForest(m["refinement"], ad["max_level"], delaunay=delaunay)
    else:
        forest = CircleForest(m["refinement"], ad["max_level"])
    # with local time steps a step spans up to 2^K steps of the finest cells: adapt as often in
    # time as without them (every counts steps of the finest cells)
    options = AdaptOptions(
        every=max(1, ad["every"] >> substep_levels(cfg)),
        indicator=ad["indicator"],
        refine=ad["refine"] or None,
        coarsen=ad["coarsen"],
        tolerance=ad["tolerance"] or None,
        conserve_energy=ad["conserve_energy"],
        grading=ad["grading"],
        budget=ad["budget"],
    )
    expression = cfg["initial"]["density"]
    kind = DistributedAdaptiveScheme if ad["forest"] == "distributed" else AdaptiveScheme
    return kind(
        comm,
        forest,
        build,
        lambda cv: initial_density(
            cv,
            expression,
            cfg["initial"]["noise"],
            cfg["initial"]["noise_degree"],
            cfg["initial"]["seed"],
        ),
        options,
        energy_model,
    )


#: the flows of the two velocities, in words
_FLOWS = {
    "gradient": "the gradient flow s grad(dE/dmu)/b",
    "attention": "the attention flow s (1/H) sum_h P a_h",
}


def solved_velocity(cfg: dict[str, Any]) -> str:
    """The velocity of the flow the configured scheme computes: ``[attention] velocity``,
    except for a scheme that solves one velocity whatever it says (its
    :attr:`~solvers.transport.SchemeSpec.velocity`; JKO: the b-weighted gradient flow of E)."""
    return scheme_spec(cfg["time"]["scheme"]).velocity or cfg["attention"]["velocity"]


def velocity_record(cfg: dict[str, Any], weights: WeightDynamics) -> dict[str, Any]:
    """Which velocity the run's scheme follows, for summary.json (docs/model.md, M1).

    ``model`` is ``[attention] velocity``; ``solved`` the flow the scheme discretises (the
    model's, except for a scheme that solves one velocity only: ``scheme = "jko"`` is always
    the b-weighted gradient flow of E; :func:`solved_velocity`);
    ``mismatch`` why the attention and gradient velocities differ for these heads
    (:func:`solvers.attention.velocity_mismatch` at t = 0; more than one head with moving
    weights always differs), or None; ``notice`` the one line a run prints when the two
    differ and the scheme solves the other one (else None).
    """
    model = cfg["attention"]["velocity"]
    solved = solved_velocity(cfg)
    mismatch = velocity_mismatch(weights.heads_at(0.0), head_weights_at(weights, 0.0))
    if mismatch is None and weights.kind != "frozen" and weights.n_heads > 1:
        mismatch = f"{weights.n_heads} heads with {weights.kind} weights, apart for t > 0"
    notice = None
    if mismatch is not None and solved != model:
        notice = (
            f'scheme "{cfg["time"]["scheme"]}" solves {_FLOWS[solved]} ([attention] velocity = '
            f'"{solved}"), not the {model} velocity asked for, which differs for these heads '
            f"({mismatch}); metrics and budget are those of the {solved} flow (docs/model.md, M1)"
        )
    return {"model": model, "solved": solved, "mismatch": mismatch, "notice": notice}
