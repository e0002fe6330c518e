r"""Adapted S^2 meshes and the JKO scheme: the red-green closure against the Delaunay closure.

The JKO scheme's two-point fluxes run between spherical circumcentres and need every facet to
separate the circumcentres of its two cells (a Delaunay mesh; ``solvers.transport.jko``
refuses other meshes). For a set of initial densities, base and max levels (issue 31's zonal
case, the demo's two bumps, the docs' ``exp(6 x0 x2)`` case, a cap), this builds the initial
adapted mesh of a run (``AdaptiveScheme``'s rounds at t = 0, default tolerance or fixed
thresholds) with the red-green closure (``SphereForest(..., delaunay=False)``, what ``fv``
runs use) and with the Delaunay closure (``delaunay=True``, what ``jko`` runs use), and prints
per mesh: cells, the facets whose circumcentres are not separated (a JKO run refuses such a
mesh), and the smallest separation over the facet's chord (d / |e|, in the plane of the
facet's normal; uniform icospheres: 0.33 and more).

Pure numpy on the replicated forest (one process; a few seconds):

    .venv/bin/python benchmarks/adaptive_delaunay.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ZONAL = "exp(3 * x[2]) + 0.2"
DEMO = "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"
#: (density, base level, max level, fixed refine threshold or None for the default tolerance)
CASES = [
    (ZONAL, 2, 4, None),
    (ZONAL, 3, 5, None),
    (ZONAL, 3, 6, None),
    (ZONAL, 3, 6, 2e-5),
    (DEMO, 2, 4, None),
    (DEMO, 3, 6, None),
    (DEMO, 3, 6, 2e-5),
    ("exp(6 * x[0] * x[2]) + 0.1", 1, 3, 1e-4),
    ("exp(6 * x[0] * x[2]) + 0.1", 2, 4, None),
    ("exp(10 * x[0]) + 0.1", 2, 4, None),
    ("exp(10 * x[0]) + 0.1", 3, 6, None),
]


def initial_mesh(density: str, base: int, top: int, refine: float | None, delaunay: bool):
    """The forest of a run's initial adapted mesh (the engine's rounds at t = 0)."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from meshes.adaptive import SphereForest
    from solvers.transport import AdaptiveScheme, AdaptOptions, initial_density

    options = AdaptOptions(every=5, refine=refine, coarsen=refine / 4 if refine else 0.0)
    scheme = AdaptiveScheme(
        MPI.COMM_SELF,
        SphereForest(base, top, delaunay=delaunay),
        lambda cv, rho: None,  # the mesh only: no scheme
        lambda cv: initial_density(cv, density),
        options,
    )
    return scheme.forest


def main() -> int:
    import numpy as np

    from meshes.adaptive import delaunay_margins

    print(
        f"{'density':44s} {'levels':>6s} {'refine':>7s} | red-green closure          | "
        "Delaunay closure"
    )
    print(f"{'':44s} {'':6s} {'':7s} | cells  refused  min d/|e|   | cells  refused  min d/|e|")
    refusals = [0, 0]
    for density, base, top, refine in CASES:
        row = f"{density:44s} {base}-{top:<4d} {refine or 'tol':>7} |"
        for k, delaunay in enumerate((False, True)):
            x, tri, _ = initial_mesh(density, base, top, refine, delaunay).conforming_mesh()
            s = delaunay_margins(x, tri)
            bad = int(np.count_nonzero(s <= 0))
            refusals[k] += bad > 0
            row += f" {len(tri):6d} {bad:4d} facets {s.min():+9.3f}   |"
        print(row.rstrip("|"), flush=True)
    print(
        f"meshes a JKO run refuses: red-green {refusals[0]} of {len(CASES)}, "
        f"Delaunay {refusals[1]} of {len(CASES)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
