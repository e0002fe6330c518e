"""Run configuration: TOML files, ``--set`` overrides, defaults and validation.

The keys, their types, defaults, allowed values and meanings are the table
:data:`drivers.engine._schema.KEYS` (printed by ``transformer-pde keys``, kept as
docs/config.md); the keys of docs/interface.md exist with exactly those meanings. This module
reads the files and checks the values: types, ranges, and the rules that tie keys together
(a JKO run needs ``time.dt``, ``feedforward`` is for boxes and the fv scheme, evolving
weights need symmetric heads, ...). What each scheme accepts (its integrators, whether it
needs ``time.dt``, its CFL limit, the feed-forward layer, adaptive steps and meshes, a law of
weights) is its :class:`solvers.transport.SchemeSpec` in the scheme registry.

Invalid input raises :class:`ConfigError` naming the key; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import copy
import functools
import math
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from drivers.engine._schema import choices, defaults, scheme_spec, scheme_words, schemes_with

if TYPE_CHECKING:
    from solvers.transport import SchemeSpec

__all__ = [
    "ConfigError",
    "DEFAULTS",
    "load_config",
    "read_toml",
    "restart_config",
    "RESTART_KEYS",
    "as_float",
    "as_int",
    "as_matrix",
    "as_vector",
    "validate",
    "parse_override",
    "head_matrices",
    "head_matrix",
    "dimension",
    "mesh_free",
]


class ConfigError(ValueError):
    """Invalid configuration; ``key`` is the dotted key (or file) at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


#: the default run configuration (from the schema of drivers.engine._schema; built on first
#: use, as the schema's tables: importing this module imports no solver)
DEFAULTS: dict[str, dict[str, Any]]


_defaults = functools.cache(defaults)


def __getattr__(name: str) -> Any:
    if name == "DEFAULTS":
        return _defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: the finest S^2 icosphere level, ``meshes.sphere.MAX_ICOSPHERE_LEVEL`` (not imported: the
#: config code imports no DOLFINx; tests/test_safe_config.py checks that they agree)
MAX_S2_LEVEL = 9
#: the most time steps a fixed time.dt may ask for (a guard against typos such as 1e-300)
MAX_STEPS = 1e9
#: the largest weight noise: one OU step of size sigma sqrt(dt) beyond ~1e3 already overflows
#: exp(beta x^T D y), and sigma^2 (the Ito correction of the energy budget) must stay finite
MAX_SIGMA = 1e6
#: the most Ornstein-Uhlenbeck grid steps (the path is kept: H d^2 8 bytes a step)
MAX_WEIGHT_STEPS = 1e7


def parse_override(item: str) -> tuple[str, str, Any]:
    """Parse ``section.key=value``; the value is read as a TOML value, else as a string."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise ConfigError("--set", f"expected section.key=value, got {item!r}")
    lhs, rhs = item.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {rhs.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs.strip()
    return section, key, value


def read_toml(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The tables of a TOML file (none if ``path`` is None) with ``--set`` overrides applied.

    The one TOML reader of the engine (``run`` and ``gaussian`` configs alike); nothing is
    validated here but the file and the override syntax.

    Raises:
        ConfigError: the file is missing or not TOML, or an override is malformed.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(str(path), "config file not found")
        try:
            raw = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(str(path), f"not valid TOML ({exc})") from None
    for item in overrides or []:
        section, key, value = parse_override(item)
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(section, "must be a table")
        raw[section][key] = value
    return raw


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a TOML file (or only defaults if ``path`` is None), apply overrides, validate."""
    return validate(read_toml(path, overrides))


#: the keys a ``--set`` may change when a run continues from a checkpoint (``--restart``)
RESTART_KEYS = (
    ("time", "t_end"),
    ("output", "every"),
    ("output", "dt"),
    ("output", "log_start"),
    ("output", "per_decade"),
    ("output", "progress"),
    ("output", "checkpoint_every"),
    ("output", "checkpoint_minutes"),
    ("output", "edi_every"),
    ("output", "pictures"),
)


def restart_config(stored: dict[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    """The configuration of a continued run: the resolved config stored with the run (in its
    checkpoints), with the ``--set`` overrides that may change on a restart.

    Args:
        stored: the resolved configuration of the run.
        overrides: ``section.key=value`` items; those of :data:`RESTART_KEYS` may change the
            value, any other must leave it as it is.

    Raises:
        ConfigError: an override is invalid, or changes a key that must stay (the message
            names the key and both values).
    """
    cfg = validate(copy.deepcopy(stored))
    allowed = ", ".join(".".join(k) for k in RESTART_KEYS)
    for item in overrides or []:
        section, key, value = parse_override(item)
        raw = copy.deepcopy(cfg)
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(section, "must be a table")
        raw.setdefault(section, {})[key] = value
        if (section, key) in RESTART_KEYS:
            cfg = validate(raw)
            continue
        before = cfg.get(section, {}).get(key)
        try:  # the value as the config would resolve it (an invalid one is a change too)
            after = validate(raw)[section][key]
        except ConfigError:
            after = value
        if after != before:
            raise ConfigError(
                f"{section}.{key}",
                f"cannot change on --restart: the run has {before!r}, --set gives {after!r} "
                f"(a restart may change only {allowed})",
            )
    return cfg


def validate(raw: dict[str, Any]) -> dict[str, Any]:
    """Merge with defaults and check every key; returns the resolved configuration.

    The tables are checked in this order (the first error found is raised): the sections
    and keys and the allowed values, ``[particles]``, ``[mesh]`` and ``[feedforward]``,
    ``[attention]``, ``[weights]``, ``[initial]``, ``[time]``, ``[output]``, ``[adapt]``,
    the diffusion's manifolds and meshes, the rules of mesh-free particles.
    """
    from drivers.engine._adapt_config import check_adapt
    from drivers.engine._heads_config import check_attention, check_weights
    from drivers.engine._particles_config import check_mesh_free_rules, check_particle_table

    cfg = _merged(raw)
    check_particle_table(cfg)
    d = _check_mesh(cfg)
    check_attention(cfg, d)
    check_weights(cfg, d)
    _check_initial(cfg)
    _check_time(cfg)
    _check_output(cfg)
    check_adapt(cfg)
    _diffusion(cfg)
    check_mesh_free_rules(cfg)
    return cfg


def _merged(raw: dict[str, Any]) -> dict[str, Any]:
    """The defaults with the tables of ``raw`` over them (unknown sections and keys refused),
    every value of a fixed set among its allowed values."""
    cfg = copy.deepcopy(_defaults())
    if "gaussian" in raw:
        raise ConfigError(
            "gaussian",
            "a [gaussian] table is a config of the Gaussian moment ODE (docs/model.md, M3): "
            "run it with `transformer-pde gaussian CONFIG.toml`",
        )
    for section, table in raw.items():
        if section not in _defaults():
            raise ConfigError(section, f"unknown section (known: {', '.join(_defaults())})")
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table")
        for key, value in table.items():
            if key not in _defaults()[section]:
                known = ", ".join(_defaults()[section])
                raise ConfigError(
                    f"{section}.{key}", f"unknown key (known in [{section}]: {known})"
                )
            cfg[section][key] = value
    for (section, key), allowed in choices().items():
        value = cfg[section][key]
        if value not in allowed:
            raise ConfigError(f"{section}.{key}", f"must be one of {list(allowed)}, got {value!r}")
    return cfg


def _check_mesh(cfg: dict[str, Any]) -> int:
    """Check ``[mesh]`` and ``[feedforward]`` (in place); returns the ambient dimension d."""
    m = cfg["mesh"]
    m["refinement"] = as_int(m["refinement"], "mesh.refinement")
    limit = {"S2": MAX_S2_LEVEL, "S1": 16, "R1": 14, "R2": 6}[m["manifold"]]
    if not (0 <= m["refinement"] <= limit):
        raise ConfigError(
            "mesh.refinement", f"must be in [0, {limit}] for {m['manifold']}, got {m['refinement']}"
        )
    if not isinstance(m["file"], str):
        raise ConfigError("mesh.file", "must be a path string")
    if m["file"] and not Path(m["file"]).is_file():
        raise ConfigError("mesh.file", f"file not found: {m['file']}")
    d = dimension(cfg)
    flat = m["manifold"].startswith("R")
    if flat:
        if m["file"]:
            raise ConfigError("mesh.file", "meshes from files are sphere meshes (S1, S2)")
        m["lower"] = as_vector(m["lower"], d, "mesh.lower")
        m["upper"] = as_vector(m["upper"], d, "mesh.upper")
        if not all(lo < hi for lo, hi in zip(m["lower"], m["upper"], strict=True)):
            raise ConfigError("mesh.upper", "must be > mesh.lower on every axis")
    f = cfg["feedforward"]
    f["A"] = as_matrix(f["A"], d, "feedforward.A", allow_zero=True).tolist()
    f["b"] = as_vector(f["b"], d, "feedforward.b")
    if not flat and (np.any(np.array(f["A"])) or any(f["b"])):
        raise ConfigError(
            "feedforward", "the affine feed-forward term (docs/model.md, M3) is for R1/R2 meshes"
        )
    return d


def _check_initial(cfg: dict[str, Any]) -> None:
    """Check ``[initial]`` (in place)."""
    ini = cfg["initial"]
    ini["noise"] = as_float(ini["noise"], "initial.noise")
    if not (math.isfinite(ini["noise"]) and ini["noise"] >= 0):
        raise ConfigError("initial.noise", f"must be finite and >= 0, got {ini['noise']}")
    ini["noise_degree"] = as_int(ini["noise_degree"], "initial.noise_degree")
    if not 1 <= ini["noise_degree"] <= 256:
        raise ConfigError("initial.noise_degree", f"must be in 1..256, got {ini['noise_degree']}")
    ini["seed"] = as_int(ini["seed"], "initial.seed")
    if ini["seed"] < 0:
        raise ConfigError("initial.seed", f"must be >= 0, got {ini['seed']}")
    if ini["noise"] > 0 and cfg["mesh"]["manifold"] not in ("S1", "S2"):
        raise ConfigError("initial.noise", "a random perturbation needs S1 or S2")
    if not isinstance(cfg["initial"]["density"], str) or not cfg["initial"]["density"].strip():
        raise ConfigError("initial.density", "must be a non-empty numpy expression string")


def _check_time(cfg: dict[str, Any]) -> None:
    """Check ``[time]`` (in place): the step, the integrator, the CFL number, the number of
    steps (of the tokens and of OU weights) and the schemes that apply a feed-forward layer."""
    w = cfg["weights"]
    t = cfg["time"]
    t["t_end"] = as_float(t["t_end"], "time.t_end")
    if not t["t_end"] > 0:
        raise ConfigError("time.t_end", f"must be > 0, got {t['t_end']}")
    t["cfl"] = as_float(t["cfl"], "time.cfl")
    t["dt"] = as_float(t["dt"], "time.dt")
    if t["dt"] < 0:
        raise ConfigError("time.dt", f"must be > 0, got {t['dt']}")
    scheme = t["scheme"]
    spec = scheme_spec(scheme)
    if spec.needs_dt and not t["dt"] > 0:
        raise ConfigError("time.dt", f"the {spec.title} scheme needs a step: set time.dt > 0")
    rks = spec.integrators or ("",)
    t["rk"] = t["rk"] or rks[0]
    if t["rk"] not in rks:
        raise ConfigError(
            "time.rk",
            f"must be one of {list(rks)} for scheme {scheme!r}, got {t['rk']!r}",
        )
    _cfl(cfg, spec)
    if t["dt"] > 0 and t["t_end"] / t["dt"] > MAX_STEPS:
        raise ConfigError(
            "time.dt",
            f"{t['dt']:g} needs {t['t_end'] / t['dt']:.3g} steps to reach t_end = {t['t_end']:g} "
            f"(at most {MAX_STEPS:.0e})",
        )
    if w["dynamics"] == "ou" and t["t_end"] / w["dt"] > MAX_WEIGHT_STEPS:
        raise ConfigError(
            "weights.dt",
            f"{w['dt']:g} needs {t['t_end'] / w['dt']:.3g} Euler-Maruyama steps to reach t_end = "
            f"{t['t_end']:g}, all kept in memory (at most {MAX_WEIGHT_STEPS:.0e})",
        )
    ff = cfg["feedforward"]
    if not spec.background and (np.any(ff["A"]) or any(ff["b"])):  # else silently ignored
        raise ConfigError(
            "feedforward",
            f"the feed-forward layer ({ff['activation']}) is applied by the "
            f"{scheme_words('background')} only, not by {scheme!r}: remove the [feedforward] "
            f"table or set time.scheme = {_names('background')}",
        )


def _check_output(cfg: dict[str, Any]) -> None:
    """Check ``[output]`` (in place): cadence, adaptive step, progress, checkpoints, EDI."""
    o = cfg["output"]
    o["every"] = as_int(o["every"], "output.every")
    if o["every"] < 1:
        raise ConfigError("output.every", f"must be >= 1, got {o['every']}")
    _cadence(cfg)
    _adaptive_step(cfg)
    o["progress"] = as_float(o["progress"], "output.progress")
    o["checkpoint_every"] = as_int(o["checkpoint_every"], "output.checkpoint_every")
    if o["checkpoint_every"] < 0:
        raise ConfigError(
            "output.checkpoint_every", f"must be >= 0 (0: off), got {o['checkpoint_every']}"
        )
    o["checkpoint_minutes"] = as_float(o["checkpoint_minutes"], "output.checkpoint_minutes")
    if o["checkpoint_minutes"] < 0:
        raise ConfigError(
            "output.checkpoint_minutes", f"must be >= 0 (0: off), got {o['checkpoint_minutes']}"
        )
    if not isinstance(o["edi"], bool):
        raise ConfigError("output.edi", f"must be true or false, got {o['edi']!r}")
    o["edi_every"] = as_int(o["edi_every"], "output.edi_every")
    if o["edi_every"] < 0:
        raise ConfigError(
            "output.edi_every", f"must be >= 0 (0: with the outputs), got {o['edi_every']}"
        )
    o["edi_every"] = o["edi_every"] or o["every"]


def _names(flag: str) -> str:
    """The schemes whose spec has ``flag``, as values: '"fv"', '"fv" or "jko"'."""
    return " or ".join(f'"{n}"' for n in schemes_with(flag))


def _cfl(cfg: dict[str, Any], spec: SchemeSpec) -> None:
    """The Courant number of a scheme with a CFL step: within its limit (with this
    reconstruction) whenever the CFL step is taken."""
    t, reconstruction = cfg["time"], cfg["transport"]["reconstruction"]
    limit = spec.cfl_limit(reconstruction)
    if limit is None or not (spec.cfl_with_dt or t["dt"] == 0) or 0 < t["cfl"] <= limit:
        return
    if spec.cfl_with_dt:
        raise ConfigError(
            "time.cfl",
            f"must be in (0, {limit}] for {reconstruction} (positivity), got {t['cfl']}",
        )
    raise ConfigError("time.cfl", f"must be in (0, {limit:g}] (or set time.dt), got {t['cfl']}")


def _adaptive_step(cfg: dict[str, Any]) -> None:
    """Check the adaptive jko step (in place)."""
    t = cfg["time"]
    if not isinstance(t["adaptive"], bool):
        raise ConfigError("time.adaptive", f"must be true or false, got {t['adaptive']!r}")
    t["dt_max"] = as_float(t["dt_max"], "time.dt_max")
    if not (math.isfinite(t["dt_max"]) and t["dt_max"] >= 0):
        raise ConfigError("time.dt_max", f"must be finite and >= 0, got {t['dt_max']}")
    if t["adaptive"] and not scheme_spec(t["scheme"]).adaptive_step:
        raise ConfigError(
            "time.adaptive",
            f"only the {scheme_words('adaptive_step')} adapts its step "
            f"(time.scheme = {t['scheme']!r})",
        )
    if t["adaptive"] and 0 < t["dt_max"] < t["dt"]:
        raise ConfigError("time.dt_max", f"must be >= time.dt = {t['dt']}, got {t['dt_max']}")


def _cadence(cfg: dict[str, Any]) -> None:
    """Check the output times in simulated time (in place)."""
    o, t_end = cfg["output"], cfg["time"]["t_end"]
    for key in ("dt", "log_start"):
        o[key] = as_float(o[key], f"output.{key}")
        if not (math.isfinite(o[key]) and o[key] >= 0):
            raise ConfigError(f"output.{key}", f"must be finite and >= 0 (0: off), got {o[key]}")
    if o["log_start"] >= t_end:
        raise ConfigError(
            "output.log_start", f"must be below time.t_end = {t_end}, got {o['log_start']}"
        )
    o["per_decade"] = as_int(o["per_decade"], "output.per_decade")
    if o["per_decade"] < 1:
        raise ConfigError("output.per_decade", f"must be >= 1, got {o['per_decade']}")
    for flag in ("clusters", "pictures"):
        if not isinstance(o[flag], bool):
            raise ConfigError(f"output.{flag}", f"must be true or false, got {o[flag]!r}")


def _diffusion(cfg: dict[str, Any]) -> None:
    """The manifolds that take ``[attention] diffusion`` > 0 (every scheme, uniform or adaptive
    meshes: an adaptive S2 forest then adds its Delaunay closure, ``_problem``)."""
    if cfg["attention"]["diffusion"] == 0:
        return
    if cfg["mesh"]["manifold"] not in ("S1", "S2"):
        raise ConfigError(
            "attention.diffusion", "noisy tokens are implemented on the spheres S1 and S2"
        )


def mesh_free(cfg: dict[str, Any]) -> bool:
    """Whether the config is a mesh-free particle run (``[particles] n`` set;
    :mod:`drivers.engine._particles_config`)."""
    return cfg.get("particles", {}).get("n") is not None


def dimension(cfg: dict[str, Any]) -> int:
    """Ambient dimension d of the configured manifold (S1: 2, S2: 3, R1: 1, R2: 2; mesh-free
    particles: ``particles.d``)."""
    if mesh_free(cfg):
        return int(cfg["particles"]["d"])
    return {"S1": 2, "S2": 3, "R1": 1, "R2": 2}[cfg["mesh"]["manifold"]]


def head_matrices(cfg: dict[str, Any]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The (Q, K, V) matrices of the configured heads."""
    d = dimension(cfg)
    return [
        tuple(head_matrix(head, h, k, d) for k in ("Q", "K", "V"))
        for h, head in enumerate(cfg["attention"]["heads"])
    ]


def head_matrix(head: dict[str, Any], h: int, k: str, d: int) -> np.ndarray:
    """The matrix ``k`` ("Q", "K" or "V") of head ``h`` (the table ``head``) in dimension d:
    "identity", a d x d nested list, or "random": independent N(0, 1/d) entries (standard
    normal scaled by 1/sqrt(d)) from ``numpy.random.default_rng([seed, h, j])``, j = 0, 1, 2
    for Q, K, V, ``seed`` the head's (default 0).

    Raises:
        ConfigError: naming ``attention.heads[h].k``.
    """
    key = f"attention.heads[{h}].{k}"
    value = head.get(k, "identity")
    if isinstance(value, str) and value not in ("identity", "random"):
        raise ConfigError(
            key, f'must be "identity", "random" or a {d}x{d} nested list, got {value!r}'
        )
    if value == "random":
        seed = as_int(head.get("seed", 0), f"attention.heads[{h}].seed")
        rng = np.random.default_rng([seed, h, "QKV".index(k)])
        return rng.standard_normal((d, d)) / math.sqrt(d)
    return as_matrix(value, d, key)


def as_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    return int(value)


def as_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, f"must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # a TOML integer beyond float64
        raise ConfigError(
            key, f"must be finite, got an integer of {len(str(value))} digits"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(key, f"must be finite, got {value}")
    return value


def as_vector(value: Any, d: int, key: str) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * d
    if not isinstance(value, list) or len(value) != d:
        raise ConfigError(key, f"must be a number or a list of {d} numbers, got {value!r}")
    return [as_float(v, key) for v in value]


def as_matrix(value: Any, d: int, key: str, allow_zero: bool = False) -> np.ndarray:
    if isinstance(value, str):
        if value == "zero" and allow_zero:
            return np.zeros((d, d))
        if value != "identity":
            names = '"identity", "zero"' if allow_zero else '"identity"'
            raise ConfigError(key, f"must be {names} or a {d}x{d} nested list, got {value!r}")
        return np.eye(d)
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(key, f"must be a {d}x{d} nested list of finite numbers") from None
    if arr.shape != (d, d):
        raise ConfigError(key, f"must be {d}x{d} (points in R^{d}), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(key, "entries must be finite")
    return arr
