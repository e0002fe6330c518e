r"""Initial positions of mesh-free particles on :math:`S^{d-1}`, any d >= 2: the uniform law, a
mixture of von Mises-Fisher laws, or positions read from a file.

Every function returns the whole (n, d) array, the same on every rank (the draws depend on the
seed only): a run then gives each rank a block of rows (:class:`solvers.transport.FreeParticles`),
so that the particles, and hence the results, do not depend on the number of ranks.

**Uniform.** Rows of a standard normal (n, d) draw, normalised (rotation invariance).

**von Mises-Fisher.** The law with density :math:`c_d(\kappa) e^{\kappa \langle \mu, x\rangle}`
on :math:`S^{d-1}` (mean direction :math:`\mu`, concentration :math:`\kappa \ge 0`), sampled
by Wood's rejection algorithm (Wood 1994, "Simulation of the von Mises Fisher distribution"):
the component :math:`w = \langle \mu, x\rangle` by rejection from a transformed Beta((d-1)/2,
(d-1)/2) proposal, then :math:`x = w \mu + \sqrt{1 - w^2}\, v`, v uniform on the unit sphere of
:math:`\mu^\perp`. The constant b is computed as :math:`(d-1)/(2\kappa + \sqrt{4\kappa^2 +
(d-1)^2})` (no cancellation at large kappa). For large kappa the angle to the centre has
:math:`\mathbb E\,\angle^2 \approx (d-1)/\kappa`. A mixture draws each particle's component
with the given probabilities first.

**File.** An ``.npy`` file of an (n, d) array, or an ``.npz`` file holding one such array (or
one named ``points``); rows finite and nonzero, projected onto the sphere
(:func:`read_positions`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["read_positions", "uniform_sphere", "vmf_mixture", "vmf_sample"]

Array = npt.NDArray[np.float64]


def uniform_sphere(n: int, d: int, rng: np.random.Generator) -> Array:
    """n points uniform on S^{d-1}, (n, d)."""
    x = rng.standard_normal((n, d))
    norms = np.linalg.norm(x, axis=1)
    while np.any(norms == 0.0):  # probability zero; redraw such rows
        bad = norms == 0.0
        x[bad] = rng.standard_normal((int(bad.sum()), d))
        norms = np.linalg.norm(x, axis=1)
    return x / norms[:, None]


def vmf_sample(n: int, mu: Array, kappa: float, rng: np.random.Generator) -> Array:
    """n points of the von Mises-Fisher law with mean direction ``mu`` (unit, (d,)) and
    concentration ``kappa`` >= 0 on S^{d-1} (Wood's algorithm, module docstring), (n, d)."""
    mu = np.asarray(mu, dtype=np.float64)
    d = mu.shape[0]
    if kappa == 0.0:
        return uniform_sphere(n, d, rng)
    m1 = d - 1.0
    b = m1 / (2.0 * kappa + math.sqrt(4.0 * kappa * kappa + m1 * m1))
    x0 = (1.0 - b) / (1.0 + b)
    c = kappa * x0 + m1 * math.log(1.0 - x0 * x0)
    w = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        z = rng.beta(0.5 * m1, 0.5 * m1, size=todo.size)
        u = rng.random(todo.size)
        cand = (1.0 - (1.0 + b) * z) / (1.0 - (1.0 - b) * z)
        with np.errstate(divide="ignore"):
            ok = kappa * cand + m1 * np.log(1.0 - x0 * cand) - c >= np.log(u)
        w[todo[ok]] = cand[ok]
        todo = todo[~ok]
    v = rng.standard_normal((n, d))
    v -= np.outer(v @ mu, mu)
    norms = np.linalg.norm(v, axis=1)
    norms[norms == 0.0] = 1.0  # probability zero: then x = w mu with |w| = 1 anyway
    v /= norms[:, None]
    x = w[:, None] * mu[None, :] + np.sqrt(np.clip(1.0 - w * w, 0.0, None))[:, None] * v
    return x / np.linalg.norm(x, axis=1)[:, None]


def vmf_mixture(
    n: int,
    centres: Array,
    kappa: Array,
    weights: Array,
    rng: np.random.Generator,
) -> Array:
    """n points of the mixture sum_c weights_c vMF(centres_c, kappa_c), (n, d); ``centres``
    (k, d) unit rows, ``kappa`` (k,) >= 0, ``weights`` (k,) probabilities."""
    centres = np.asarray(centres, dtype=np.float64)
    k, d = centres.shape
    which = rng.choice(k, size=n, p=np.asarray(weights, dtype=np.float64)) if k > 1 else None
    out = np.empty((n, d))
    for c in range(k):
        rows = np.arange(n) if which is None else np.flatnonzero(which == c)
        out[rows] = vmf_sample(rows.size, centres[c], float(kappa[c]), rng)
    return out


def read_positions(path: str | Path, n: int, d: int) -> tuple[Array, float]:
    """The positions of the file ``path`` projected onto S^{d-1}, and the largest distance
    ``max_i ||x_i| - 1|`` of a row from the sphere before the projection.

    Raises:
        ValueError: one line: the file cannot be read, holds no (n, d) array of finite
            numbers, or has a zero row.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"cannot read {path} as .npy/.npz ({exc})") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            names = list(loaded.files)
            name = "points" if "points" in names else (names[0] if len(names) == 1 else None)
            if name is None:
                raise ValueError(f"{path} holds the arrays {names}: need one, or one named points")
            try:
                arr = np.asarray(loaded[name])
            except (OSError, EOFError, ValueError) as exc:
                raise ValueError(f"cannot read {path}[{name}] ({exc})") from None
    else:
        arr = np.asarray(loaded)
    if arr.dtype.kind not in "iuf" or arr.shape != (n, d):
        raise ValueError(
            f"{path} must hold a real ({n}, {d}) array (particles.n, particles.d), got "
            f"{arr.dtype} {arr.shape}"
        )
    x = arr.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{path}: positions must be finite")
    norms = np.linalg.norm(x, axis=1)
    if np.any(norms == 0.0):
        raise ValueError(f"{path}: row {int(np.argmax(norms == 0.0))} is zero (no direction)")
    return x / norms[:, None], float(np.max(np.abs(norms - 1.0)))
