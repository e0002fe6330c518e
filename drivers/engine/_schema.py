"""The configuration schema: every key of a run config (and of a ``gaussian`` config), its type,
default, allowed values and meaning, in one table.

This table is the single source of the keys: :mod:`drivers.engine._config` takes its defaults and
its lists of allowed values from it (and checks everything else in ``validate``), the command
``transformer-pde keys`` prints it, and ``docs/config.md`` is that output, kept in sync by
``tests/test_config_reference.py``. Regenerate with::

    transformer-pde keys > docs/config.md

The schemes (``[time] scheme``), their integrators (``[time] rk``) and what they accept come
from the scheme registry of :mod:`solvers.transport` (:class:`solvers.transport.SchemeSpec`).
The registry is imported on first use, not with this module: :data:`SECTIONS` and
:data:`KEYS` are built when first asked for (and kept), so importing this module, or
:mod:`drivers.engine._config`, imports neither DOLFINx nor PETSc, and a script may import
``load_config`` before it hands its PETSc options to ``petsc4py.init`` (reading a config does
import the solvers).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from solvers.transport import SchemeSpec


__all__ = [
    "Key",
    "SECTIONS",
    "KEYS",
    "GAUSSIAN_KEYS",
    "MAX_ADAPT_LEVEL",
    "defaults",
    "choices",
    "reference",
    "scheme_spec",
    "scheme_words",
    "schemes_with",
]


@dataclass(frozen=True)
class Key:
    """One configuration key.

    Attributes:
        section: the TOML table (``mesh``, ``attention``, ...).
        name: the key inside the table.
        type: the accepted TOML type, in words (``integer``, ``number``, ``string``, ...).
        default: the value when the key is absent (``None``: required).
        meaning: one line of meaning (with the valid range where it is not in ``choices``).
        choices: the allowed values of a string key (empty: any value of ``type``).
    """

    section: str
    name: str
    type: str
    default: Any
    meaning: str
    choices: tuple[str, ...] = ()


#: the tables of a run config, in the order of the reference, with one line each, and every
#: key of a run config: module attributes built on first use (``__getattr__`` below)
SECTIONS: dict[str, str]
KEYS: tuple[Key, ...]

#: the finest adaptive level per manifold (S2 level 10: 21 million cells if uniform)
MAX_ADAPT_LEVEL = {"S2": 10, "S1": 24}


def _words(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _specs() -> dict[str, SchemeSpec]:
    """The scheme registry's specs, imported on first use (module docstring)."""
    from solvers.transport import SCHEME_SPECS

    return SCHEME_SPECS


def scheme_spec(name: str) -> SchemeSpec:
    """:func:`solvers.transport.scheme_spec` (what the scheme ``name`` accepts), imported on
    first use.

    Raises:
        KeyError: no scheme of that name is registered.
    """
    from solvers.transport import scheme_spec as spec_of

    return spec_of(name)


def schemes_with(flag: str) -> list[str]:
    """The registered schemes whose :class:`~solvers.transport.SchemeSpec` has ``flag`` true
    (``"background"``, ``"adaptive_mesh"``, ...), in registration order."""
    return [n for n, spec in _specs().items() if getattr(spec, flag)]


def scheme_words(flag: str) -> str:
    """The registered schemes whose spec has ``flag``, in words: "fv scheme", "fv and jko
    schemes" ("no scheme" when none has it)."""
    names = schemes_with(flag)
    return f"{_words(names)} scheme{'s' if len(names) > 1 else ''}" if names else "no scheme"


def _integrators() -> str:
    """The integrators of every scheme, the default first."""
    return "; ".join(
        f"{n} {s.integrators[0]} (default), {', '.join(s.integrators[1:])}"
        if s.integrators
        else f"{n}: none"
        for n, s in _specs().items()
    )


def _steps() -> str:
    """What ``[time] dt`` means for each scheme."""
    specs = _specs().values()
    parts = [
        ("required by", [s.name for s in specs if s.needs_dt]),
        ("fixed step for", [s.name for s in specs if s.max_cfl and not s.cfl_with_dt]),
        ("an upper bound for", [s.name for s in specs if s.cfl_with_dt]),
    ]
    return "; ".join(f"{what} {_words(names)}" for what, names in parts if names)


def _cfl_limits() -> str:
    """The range of ``[time] cfl`` of each scheme with a CFL step."""
    out = []
    for n, s in _specs().items():
        if isinstance(s.max_cfl, dict):
            ranges = sorted(s.max_cfl.items(), key=lambda item: item[1])
            out.append(f"{n} in " + " or ".join(f"(0, {v:g}] ({k})" for k, v in ranges))
        elif s.max_cfl:
            out.append(f"{n} in (0, {s.max_cfl:g}]")
    return "; ".join(out)


def _run_sections() -> dict[str, str]:
    """The tables of a run config, in the order of the reference, with one line each
    (:data:`SECTIONS`)."""
    return {
        "mesh": "the manifold of the tokens and its mesh",
        "feedforward": "the feed-forward layer A x + b, or relu(A x + b) (boxes R1/R2, "
        f"{scheme_words('background')} only)",
        "attention": "the heads of multi-head self-attention and how the velocity is evaluated",
        "weights": "how the heads' matrices evolve in time (docs/model.md, M1b)",
        "initial": "the initial density of the tokens",
        "time": "the time interval and the scheme",
        "transport": "the finite-volume reconstruction and the stepping of the diffusion",
        "output": "what is written, and how often",
        "adapt": "adaptive meshes that follow the solution (S1/S2 built-in meshes, "
        f"{scheme_words('adaptive_mesh')}; docs/adaptivity.md); max_level = 0 keeps the uniform "
        "mesh; jko runs on S2 add the cells of a Delaunay closure (what their fluxes need)",
        "particles": 'mesh-free particles on S^{d-1}, any d >= 2 (time.scheme = "particles"): a '
        "[particles] table with n replaces the mesh (without it the particle scheme puts one "
        "particle at each cell centre of [mesh]); the [mesh], [initial] and [adapt] tables then "
        "keep their defaults, time.dt > 0 is the step, and the heads are d x d",
    }


_IDENTITY_HEAD = [{"Q": "identity", "K": "identity", "V": "identity"}]


def _run_keys() -> tuple[Key, ...]:
    """Every key of a run config (:data:`KEYS`)."""
    SCHEME_SPECS = _specs()  # noqa: N806
    from solvers.transport import LIMITERS  # lazy, as _specs

    # fmt: off
    return (
        # [mesh]
        Key("mesh", "manifold", "string", "S2", "S1 circle, S2 sphere, R1/R2 boxes",
            ("S1", "S2", "R1", "R2")),
        Key("mesh", "refinement", "integer", 3,
            "S2: icosphere level 0..9 (20 * 4^level cells; the memory check refuses what does "
            "not fit the node); S1: 16 * 2^refinement cells, 0..16; R1 (0..14), R2 (0..6): "
            "16 * 2^refinement cells per axis"),
        Key("mesh", "file", "string", "",
            "a mesh file (meshio format: vertices on the unit sphere) instead of the built-in "
            "mesh; S1/S2 only; empty: built-in"),
        Key("mesh", "lower", "number or list of d numbers", -4.0, "lower corner of the box (R1/R2)"),
        Key("mesh", "upper", "number or list of d numbers", 4.0,
            "upper corner of the box (R1/R2), > lower on every axis"),
        # [feedforward]
        Key("feedforward", "A", '"zero", "identity" or d x d list', "zero",
            "the matrix A of the feed-forward term A x + b (R1/R2)"),
        Key("feedforward", "b", "number or list of d numbers", 0.0,
            "the vector b of the feed-forward term A x + b (R1/R2)"),
        Key("feedforward", "activation", "string", "affine",
            "affine: the field A x + b (Gaussians stay Gaussian, docs/model.md M3); relu: "
            "max(A x + b, 0) componentwise (not affine: Gaussians do not stay Gaussian)",
            ("affine", "relu")),
        # [attention]
        Key("attention", "beta", "number", 1.0, "inverse temperature of the softmax, > 0"),
        Key("attention", "sign", "integer", 1,
            "+1: the attention dynamics of Geshkovski et al.; -1: tokens go down the energy ([P1])"),
        Key("attention", "heads", "list of tables {Q, K, V, seed}", _IDENTITY_HEAD,
            'the heads; each matrix "identity", "random" (independent N(0, 1/d) entries, i.e. '
            "standard normal scaled by 1/sqrt(d), drawn from numpy's default_rng([seed, h, k]) "
            "for head h and k = 0, 1, 2 for Q, K, V; the head's seed >= 0, default 0) or a d x d "
            "nested list (d = 2 on S1, 3 on S2, particles.d for mesh-free particles)"),
        Key("attention", "backend", "string", "auto",
            "how the nonlocal velocity is summed: auto picks per head the cheapest of compiled "
            "brute force, the low-rank expansion and the certified spectral sums (S1/S2, any beta) "
            "whose error bound meets tolerance; lowrank / spectral: that method where it applies, "
            "else brute force",
            ("auto", "brute", "lowrank", "numba", "numpy", "spectral")),
        Key("attention", "tolerance", "number", 1e-10,
            "relative accuracy asked of the low-rank expansion and the spectral sums, in (0, 1)"),
        Key("attention", "velocity", "string", "attention",
            "attention: the softmax velocity s (1/H) sum_h P a_h; gradient: the weighted "
            "Wasserstein gradient s grad(dE/dmu) / b of the interaction energy (what the JKO "
            "scheme discretises; equal to attention for one head with V = Q^T K symmetric)",
            ("attention", "gradient")),
        Key("attention", "diffusion", "number", 0.0,
            "noise nu >= 0 of the tokens: the PDE gains nu Delta_S mu (fv: two-point "
            "Laplace-Beltrami fluxes between circumcentres; jko: the entropy term of the step; "
            "particles: Brownian motion on the sphere, seeded by weights.seed); S1/S2; on "
            "adaptive S2 meshes the forest adds its Delaunay closure; 0: none"),
        # [weights]
        Key("weights", "dynamics", "string", "frozen",
            "frozen heads; Ornstein-Uhlenbeck or oscillating D_h(t) (heads (I, D, D)); "
            "fokker-planck: a law of weights on a parameter mesh",
            ("frozen", "ou", "oscillating", "fokker-planck")),
        Key("weights", "init", "string", "config",
            "config: D_h(0) = V_h of [attention] heads (needs V symmetric, Q^T K = V); "
            "random: D_h(0) = Z + Z^T, Z standard normal (seeded)",
            ("config", "random")),
        Key("weights", "seed", "integer", 0, "seed of every random draw (>= 0)"),
        Key("weights", "phases", "string", "equispaced",
            "oscillating: phase of head h is 2 pi h / H (equispaced) or uniform on [0, 2 pi) "
            "(random, seeded)",
            ("equispaced", "random")),
        Key("weights", "sigma", "number", math.sqrt(2.0),
            "noise of the OU weights; diffusion of the weight law (in [0, 1e6]; default sqrt 2)"),
        Key("weights", "dt", "number", 5e-3, "time grid of the OU path and of the weight law, > 0"),
        Key("weights", "p", "integer", 1,
            "fokker-planck: dimension of the parameter theta, 1..3 (D(theta) = V_1 + sum_k "
            "theta_k B_k)"),
        Key("weights", "B", "list of p symmetric d x d matrices", [],
            "fokker-planck: the directions B_k (default: e_1 e_1^T for each k)"),
        Key("weights", "lower", "number or list of p numbers", -3.0,
            "fokker-planck: lower corner of the parameter box"),
        Key("weights", "upper", "number or list of p numbers", 3.0,
            "fokker-planck: upper corner of the parameter box"),
        Key("weights", "cells", "integer or list of p integers", 32,
            "fokker-planck: cells per axis of the parameter mesh (at most 4096 in all)"),
        Key("weights", "centre", "number or list of p numbers", 0.5,
            "fokker-planck: mean of the OU drift of theta"),
        Key("weights", "mean0", "number or list of p numbers", -0.5,
            "fokker-planck: mean of the initial Gaussian law of theta"),
        Key("weights", "std0", "number", 0.3,
            "fokker-planck: standard deviation of the initial law of theta, > 0"),
        # [initial]
        Key("initial", "density", "string", "1 + 0.5 * x[0]",
            "an expression in the coordinates x[0], x[1] (, x[2]) (grammar below); normalised to "
            "mass 1; must be >= 0 with positive mass"),
        Key("initial", "noise", "number", 0.0,
            "relative amplitude of a seeded random perturbation: the density times 1 + noise phi, "
            "phi a random field of unit root-mean-square with harmonics of degree 1..noise_degree "
            "(near-uniform random data for metastability studies); >= 0, 0: none"),
        Key("initial", "noise_degree", "integer", 8,
            "highest degree (S2) or wave number (S1) of the random perturbation, 1..256"),
        Key("initial", "seed", "integer", 0, "seed of the random perturbation, >= 0"),
        # [time]
        Key("time", "t_end", "number", 1.0, "final time, > 0"),
        Key("time", "scheme", "string", "fv",
            "; ".join(f"{n}: {s.summary}" for n, s in SCHEME_SPECS.items()),
            tuple(SCHEME_SPECS)),
        Key("time", "cfl", "number", 0.4, f"Courant number: {_cfl_limits()}"),
        Key("time", "dt", "number", 0.0, f"time step: {_steps()}; 0: from cfl"),
        Key("time", "adaptive", "boolean", False,
            "jko: adapt the step tau from dt (the first step) up to dt_max, growing through slow "
            "phases (metastable plateaus) and shrinking when Newton struggles; fv and particles "
            "choose their steps from cfl"),
        Key("time", "dt_max", "number", 0.0,
            "the largest step of the adaptive jko step (0: 100 dt), >= dt"),
        Key("time", "rk", "string", "",
            f"time integrator: {_integrators()}; empty: the scheme's default"),
        # [transport]
        Key("transport", "reconstruction", "string", "muscl",
            "fv: piecewise-linear limited (second order) or piecewise-constant (first order)",
            ("muscl", "upwind")),
        Key("transport", "limiter", "string", "barth-jespersen",
            "fv muscl: the slope limiter; barth-jespersen: face values within the neighbours' "
            "extremes (clipped to first order at a cluster's peak); positivity: only 0 <= face "
            "value <= 2 rho_i (second order at smooth extrema, anti-dissipative where the "
            "density is under-resolved; docs/numerics.md)",
            LIMITERS),
        Key("transport", "diffusion_step", "string", "coupled",
            "fv with attention.diffusion > 0: coupled: the diffusion fluxes in every Runge-Kutta "
            "stage, dt from the combined Courant number (cfl bounds transport + diffusion); "
            "strang: diffusion half steps by sub-steps around the transport step, dt from the "
            "transport alone (cheaper on fine meshes); implicit: a backward-Euler diffusion step "
            "(PETSc CG + GAMG, options prefix diffusion_) after the transport step, first order "
            "in dt (strong noise on fine meshes; docs/numerics.md)",
            ("coupled", "strang", "implicit")),
        # [output]
        Key("output", "every", "integer", 10,
            "write density.xdmf and a metrics row every k-th step (t = 0 and t_end always), >= 1; "
            "off when dt or log_start is set"),
        Key("output", "dt", "number", 0.0,
            "write at the times j dt of simulated time instead of every k-th step (the steps "
            "stop on them; >= 0, 0: off)"),
        Key("output", "log_start", "number", 0.0,
            "write at log-spaced times log_start 10^(j / per_decade) instead of every k-th step "
            "(for metastable plateaus; >= 0, < t_end, 0: off); together with dt: both"),
        Key("output", "per_decade", "integer", 10,
            "log-spaced outputs per decade of time (with log_start), >= 1"),
        Key("output", "clusters", "boolean", True,
            "cluster statistics at every output on S1/S2: n_clusters in metrics.csv, "
            "clusters.csv (mass, centre, angular radius of each cluster, with identities) and "
            "cluster_events.csv (births, deaths, merges, splits); docs/model.md, M1c"),
        Key("output", "pictures", "boolean", True,
            "draw density.png, density_map.png and density_3d.png (S2), metrics.png and edi.png at "
            "the end of the run "
            "(rank 0, 5-30 s); false (or run --no-pictures) skips them (sweeps, tests; the data "
            "files are the same)"),
        Key("output", "progress", "number", 5.0, "seconds between progress lines on rank 0"),
        Key("output", "checkpoint_every", "integer", 0,
            "also checkpoint every k-th step for --restart (0: off; a checkpoint is always written "
            "on SIGINT/SIGTERM and every checkpoint_minutes)"),
        Key("output", "checkpoint_minutes", "number", 10.0,
            "checkpoint for --restart every this many minutes of wall time, so that a killed run "
            "loses at most that much (0: off; >= 0)"),
        Key("output", "edi", "boolean", True,
            "the energy-dissipation budget: its columns in metrics.csv and edi.png (kernel sums "
            "by the attention backend; the bound of low-rank sums in summary.json)"),
        Key("output", "edi_every", "integer", 0,
            "add the state to the budget every k-th step and at every output and checkpoint "
            "(0: with the outputs only)"),
        # [adapt]
        Key("adapt", "max_level", "integer", 0,
            "finest level of the adaptive mesh, > mesh.refinement (the base level, never coarsened); "
            f"S2 up to {MAX_ADAPT_LEVEL['S2']}, S1 up to {MAX_ADAPT_LEVEL['S1']}; 0: no adaptation"),
        Key("adapt", "every", "integer", 10,
            "steps between adaptations, >= 1 (with local_time_stepping: steps of the finest cells)"),
        Key("adapt", "indicator", "string", "mass",
            "mass: m h per cell (its share of a bound of the W1 error); jump: h |K| max |rho_i - "
            "rho_j| over the neighbours (L1 error of a smooth density)", ("mass", "jump")),
        Key("adapt", "tolerance", "number", 0.0,
            "the error estimate the run keeps below: the sum of the indicators over the cells "
            "(mass: a bound of the W1 error of the cell measure), equidistributed (threshold "
            "tolerance / cells); > 0, or 0: 10x the estimate of the uniform max_level mesh "
            "(docs/adaptivity.md); not with refine"),
        Key("adapt", "refine", "number", 0.0,
            "experts: a fixed threshold instead of the tolerance: split a cell whose indicator "
            "exceeds this, > 0 (0: thresholds from the tolerance)"),
        Key("adapt", "coarsen", "number", 0.0,
            "experts, with refine: merge sibling cells whose parent's estimated indicator is below "
            "this, in [0, refine/2] (0: never); 0 without refine"),
        Key("adapt", "grading", "integer", 0,
            "graded refinement, >= 0: no cell is more than one level coarser than any cell "
            "within grading + 1 neighbours (the 2:1 balance at that distance; merges that would "
            "break it are refused); 0: the 2:1 balance only; the energy budget of a clustering "
            "run needs 2 (docs/adaptivity.md)"),
        Key("adapt", "budget", "number", 1e-3,
            "fv, heads with symmetric Q^T K = V, no noise: also refine where the fluxes' numerical "
            "dissipation makes the energy budget drift, until the predicted drift is below "
            "budget times the dissipation rate, and hold merges that would raise it (>= 0; 0: "
            "off; docs/adaptivity.md)"),
        Key("adapt", "conserve_energy", "boolean", True,
            "correct the masses carried onto refined cells so that the cell-centre energy is "
            "continuous across each adaptation (false: the plain limited linear transfer)"),
        Key("adapt", "forest", "string", "replicated",
            "replicated: every rank holds the whole forest of cells (all features); distributed: "
            "each rank only its own leaves, leaf data by point-to-point messages, no gather "
            "(S2 only; docs/adaptivity.md)",
            ("replicated", "distributed")),
        Key("adapt", "local_time_stepping", "boolean", False,
            "fv: the velocity (the sums over all cells) at the CFL step of the base-level cells, "
            "2^K times the finest cells' (K = max_level - mesh.refinement), predicted and then "
            "quadratic in time, the fluxes at 2^K substeps (docs/numerics.md); the run then adapts "
            "every max(1, every / 2^K) steps, as often in time as without"),
        # [particles]
        Key("particles", "n", "integer", None,
            "number of particles, 1..1,000,000; required in a [particles] table (its presence "
            "makes the run mesh-free)"),
        Key("particles", "d", "integer", 3, "ambient dimension: the tokens lie on S^{d-1}, 2..64"),
        Key("particles", "seed", "integer", 0, "seed of the initial positions (uniform, vmf), >= 0"),
        Key("particles", "initial", "string", "uniform",
            "the initial law: uniform on S^{d-1}; vmf: a mixture of von Mises-Fisher laws "
            "(centres, kappa, weights; sampled by Wood's algorithm); file: the positions in "
            "particles.file; every particle has mass 1/n",
            ("uniform", "vmf", "file")),
        Key("particles", "centres", "list of d-vectors", [],
            "vmf: the mean directions of the mixture's components (normalised; nonzero)"),
        Key("particles", "kappa", "number or list of numbers", 10.0,
            "vmf: the concentration of each component (one for all, or one each), >= 0 "
            "(0: uniform; the angular radius of a tight component is about sqrt((d - 1)/kappa))"),
        Key("particles", "weights", "list of numbers", [],
            "vmf: the components' probabilities (>= 0, positive sum, normalised; default: equal)"),
        Key("particles", "file", "string", "",
            "file: an .npy file of an (n, d) array, or an .npz file with one such array (or one "
            "named points); finite, nonzero rows, projected onto the sphere (a warning when a row "
            "is off it by more than 1e-6)"),
    )
    # fmt: on


#: the keys of a ``transformer-pde gaussian`` config (one table ``[gaussian]``; docs/model.md, M3)
GAUSSIAN_KEYS: tuple[Key, ...] = (
    Key("gaussian", "m0", "list of d numbers", None, "initial mean (required; fixes d)"),
    Key("gaussian", "S0", '"identity" or d x d list', "identity",
        "initial covariance, symmetric positive semidefinite"),
    Key("gaussian", "A", '"zero", "identity" or d x d list', "zero", "feed-forward matrix A"),
    Key("gaussian", "b", "number or list of d numbers", 0.0, "feed-forward vector b"),
    Key("gaussian", "B", '"zero", "identity" or d x d list', "zero",
        "attention matrix B of the kernel exp(y^T B x)"),
    Key("gaussian", "V", '"zero", "identity" or d x d list', "zero", "attention value matrix V (X = V softmax-mean + A x + b)"),
    Key("gaussian", "t_end", "number", 1.0, "final time, > 0"),
    Key("gaussian", "outputs", "integer", 201, "number of output times, >= 2"),
)  # fmt: skip


@functools.cache
def _run_tables() -> tuple[dict[str, str], tuple[Key, ...]]:
    """:data:`SECTIONS` and :data:`KEYS`, built on first use (they quote the scheme registry)."""
    return _run_sections(), _run_keys()


def __getattr__(name: str) -> Any:
    """``SECTIONS`` and ``KEYS`` on first use (PEP 562): importing this module imports no
    solver."""
    if name == "SECTIONS":
        return _run_tables()[0]
    if name == "KEYS":
        return _run_tables()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def defaults() -> dict[str, dict[str, Any]]:
    """The default run configuration, ``{section: {key: value}}`` (a fresh copy)."""
    sections, keys = _run_tables()
    out: dict[str, dict[str, Any]] = {s: {} for s in sections}
    for k in keys:
        out[k.section][k.name] = json.loads(json.dumps(k.default))
    return out


def choices() -> dict[tuple[str, str], tuple[str, ...]]:
    """The allowed values of the string keys that have a fixed list, ``{(section, key): ...}``;
    ``time.scheme``: the schemes registered now (one registered after this module was
    imported included)."""
    out = {(k.section, k.name): k.choices for k in _run_tables()[1] if k.choices}
    out[("time", "scheme")] = tuple(_specs())
    return out


def _toml(value: Any) -> str:
    """A value as it would be written in TOML."""
    if value is None:
        return "(required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        inner = ", ".join(
            f"{{ {', '.join(f'{a} = {_toml(b)}' for a, b in d.items())} }}" for d in value
        )
        return f"[{inner}]"
    return json.dumps(value)


def _table(keys: tuple[Key, ...]) -> list[str]:
    lines = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for k in keys:
        allowed = ", ".join(f"`{_toml(c)}`" for c in k.choices)
        lines.append(f"| `{k.name}` | {k.type} | `{_toml(k.default)}` | {allowed} | {k.meaning} |")
    return lines


def _expression_grammar() -> list[str]:
    from solvers.transport import EXPRESSION_CONSTANTS, EXPRESSION_FUNCTIONS

    names = ", ".join(f"`{n}`" for n in sorted(EXPRESSION_FUNCTIONS))
    consts = ", ".join(f"`{n}`" for n in sorted(EXPRESSION_CONSTANTS))
    return [
        "Density expressions are data, not code: they are parsed and checked against a whitelist",
        "(never passed to `eval`). Allowed: numbers, the coordinates `x[0]`, `x[1]`, `x[2]`",
        f"(up to d), the constants {consts}, the operators `+ - * / ** % //`, comparisons `< <= > >= == !=`",
        f"(giving 0 or 1), and the functions {names}.",
    ]


def reference() -> str:
    """The configuration reference (Markdown): every key of both kinds of config."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `transformer-pde keys > docs/config.md`; do not edit by hand -->",
        "",
        "A run config (`transformer-pde run CONFIG.toml`) is a TOML file with the tables below;",
        "every key is optional and takes its default when absent. Unknown tables or keys, values",
        "of the wrong type or outside their range are errors (exit code 2, one line naming the",
        "key) before any work starts. A value can be overridden on the command line with",
        "`--set section.key=value` (TOML syntax, e.g. `--set attention.beta=4`,",
        "`--set 'mesh.manifold=\"S1\"'`). Examples for every scheme are in `configs/`.",
        "",
        "Notation: d is the ambient dimension (S1: 2, S2: 3, R1: 1, R2: 2), H the number of heads,",
        "s = `attention.sign`, E the interaction energy and b the harmonic mean of the heads'",
        "partition functions (docs/model.md, M1).",
    ]
    sections, keys = _run_tables()
    for section, meaning in sections.items():
        lines += ["", f"## [{section}]", "", meaning[0].upper() + meaning[1:] + ".", ""]
        lines += _table(tuple(k for k in keys if k.section == section))
        if section == "initial":
            lines += ["", *_expression_grammar()]
    lines += [
        "",
        "## [gaussian] (`transformer-pde gaussian CONFIG.toml`)",
        "",
        "The Gaussian moment ODE alone (docs/model.md, M3): a config with exactly this table.",
        "",
    ]
    lines += _table(GAUSSIAN_KEYS)
    return "\n".join(lines) + "\n"
