"""How one head's kernel sums were evaluated: :class:`HeadChoice` (reported in summary.json)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeadChoice"]


@dataclass(frozen=True)
class HeadChoice:
    r"""How one head was evaluated.

    Attributes:
        method: "lowrank", "spectral" or the brute-force backend ("numba" / "numpy").
        rho: the bound :math:`\rho = r_x r_u` on the expanded exponent.
        degree: the degree :math:`p` (None: brute).
        rank: the number of features (None: brute).
        bound: the a-priori bound :math:`2\varepsilon_p/(1-\varepsilon_p)` (None: brute).
        reason: why, in words.
        basis: "monomial" (centred monomials) or "sphere" (orthonormal sphere basis); None:
            brute; "harmonic" for the spectral sums (spherical harmonics or Fourier modes).
        nodes: spectral sums: the Chebyshev nodes in kappa (1 for zonal heads); else None.
        fallback: spectral sums: how many targets (over all ranks) were summed again by brute
            force because their certified bound missed the tolerance; else None.

    For the spectral sums (method "spectral") ``rho`` is the largest
    :math:`\kappa = |A^T x|`, ``degree`` the truncation degree, ``rank`` the coefficients per
    field and ``bound`` the largest certified bound over the targets (after the evaluation).
    """

    method: str
    rho: float
    degree: int | None = None
    rank: int | None = None
    bound: float | None = None
    reason: str = ""
    basis: str | None = None
    nodes: int | None = None
    fallback: int | None = None
