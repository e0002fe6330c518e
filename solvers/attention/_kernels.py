r"""Kernels for the attention sums: a compiled (numba) backend and a blocked numpy reference.

For targets :math:`x_i \in \mathbb{R}^d` (:math:`i < m`), sources :math:`y_j \in \mathbb{R}^d`
with masses :math:`m_j > 0` (:math:`j < n`) and matrices :math:`A_h \in \mathbb{R}^{d \times d}`
(:math:`h < H`) both backends compute

.. math::

    \log Z_h(x_i) = \log \sum_j m_j \exp(x_i^T A_h y_j), \qquad
    \bar y_h(x_i) = \frac{\sum_j m_j \exp(x_i^T A_h y_j)\, y_j}{Z_h(x_i)},

in float64 with a log-sum-exp shift: with :math:`e_{ij} = x_i^T A_h y_j + \log m_j` and any
shift :math:`M_i \ge \max_j e_{ij}`, :math:`\log Z_h = M_i + \log \sum_j e^{e_{ij} - M_i}`, so no
exponential overflows whatever :math:`\beta |A_h|`. The masses enter through :math:`\log m_j`
(callers pass the logarithms of the positive masses; zero masses are dropped before), so
masses spanning many orders of magnitude are harmless too. Neither backend forms an
:math:`m \times n` array: numpy works on blocks of at most :data:`BLOCK_ENTRIES` entries, numba
on chunks of :data:`SOURCE_CHUNK` sources per target.

The numba kernel runs ``prange`` over the targets; for each target and head it sweeps the
sources once in chunks, with an online (running maximum) shift: the chunk maximum
:math:`c` replaces :math:`M` when larger and rescales the partial sums by :math:`e^{M - c}`.
Precomputing :math:`B_h = Y A_h^T` (stored :math:`(H, d, n)`, source index fastest) makes each
exponent a :math:`d`-term dot product, and every inner loop is a plain loop over the chunk
that LLVM vectorises, including the exponential (:func:`exp_nonpositive_array`: our own
branch-free ``exp`` for :math:`x \le 0`, since the scalar libm call does not vectorise).

Single pass with an a-priori shift. Cauchy-Schwarz gives
:math:`e_{ij} \le M_i := \max_j \log m_j + |x_i| \max_j |A_h y_j|` before any source is
read, and :math:`\max_j e_{ij} \ge M_i - G_i` with the gap
:math:`G_i = (\max_j \log m_j - \min_j \log m_j) + 2 |x_i| \max_j |A_h y_j|`. When
:math:`G_i \le` :data:`GAP_SINGLE_PASS` (every kernel pair on the sphere with
:math:`\beta \|A_h\| \le 300` and masses within a factor :math:`e^{100}` of each other), every
weight :math:`e^{e_{ij} - M_i} \ge e^{-G_i}` is a normal float64 and the sum keeps full relative
precision, so the exponents, the exponential and the four sums are fused in one sweep over the
sources (no buffer, no maximum pass: about 1.3x faster). Otherwise that target and head take the
chunked online path above. Which path a target takes depends on the target and on the gathered
sources only, never on the number of ranks.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from solvers._jit import read_only

try:
    import numba
    from llvmlite import ir as llvm_ir
    from numba.core import cgutils
    from numba.core import types as numba_types
    from numba.extending import intrinsic

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

__all__ = [
    "BLOCK_ENTRIES",
    "GAP_SINGLE_PASS",
    "HAVE_NUMBA",
    "SOURCE_CHUNK",
    "exp_nonpositive_array",
    "kernel_sums_numba",
    "kernel_sums_numpy",
]

#: Largest number of target-source entries held at once by the numpy backend.
BLOCK_ENTRIES = 2_000_000
#: Sources per chunk in the numba kernel (a chunk of exponents stays in L1 cache).
SOURCE_CHUNK = 2048
#: Largest a-priori log-sum-exp gap for the single-pass path (module docstring):
#: e^-600 = 2.7e-261 is far above the float64 underflow threshold 2.2e-308.
GAP_SINGLE_PASS = 600.0

# exp(x) for x <= 0 (see exp_nonpositive_array): x = k ln2 + r with k = round(x log2 e),
# exp(x) = 2^k exp(r). ln2 is split into a high part with 20 trailing zero bits (k * LN2_HI is
# exact for |k| < 2^20) and a low part. Adding _SHIFTER = 1.5 * 2^52 + 1023 rounds x log2 e to
# the integer k and leaves k + 1023 (the biased exponent of 2^k) in the low mantissa bits.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFTER = 6755399441055744.0 + 1023.0
_EXP_CUTOFF = -708.0  # below this exp(x) < 3.3e-308 is returned as 0 (no subnormals)


def _economized_exp_coefficients(
    degree: int = 11, taylor_degree: int = 20, half_width: Fraction = Fraction(7, 20)
) -> tuple[list[float], float]:
    """Chebyshev economisation, in exact rational arithmetic, of the Taylor polynomial of exp.

    Starts from the degree-``taylor_degree`` Taylor polynomial on [-a, a], a = ``half_width``
    (>= ln2/2 plus the rounding of k), and removes its top monomials with the Chebyshev
    polynomials T_n(r/a) / 2^(n-1) down to ``degree``: a near-minimax polynomial. Returns the
    monomial coefficients c_0..c_degree (rounded to float64) and the bound on the removed part
    (3.5e-18 for the defaults; the Taylor remainder is below 1e-25).
    """
    a = half_width
    q = [a**i / math.factorial(i) for i in range(taylor_degree + 1)]  # coefficients in r / a
    cheb = [[1], [0, 1]]  # monomial coefficients of T_0, T_1, ...
    for _ in range(2, taylor_degree + 1):
        nxt = [0] + [2 * c for c in cheb[-1]]
        for i, c in enumerate(cheb[-2]):
            nxt[i] -= c
        cheb.append(nxt)
    removed = Fraction(0)
    for n in range(taylor_degree, degree, -1):
        c = q[n] / 2 ** (n - 1)
        removed += abs(c)
        for i, t in enumerate(cheb[n]):
            q[i] -= c * t
    return [float(q[i] / a**i) for i in range(degree + 1)], float(removed)


_EXP_COEFFS, _EXP_TRUNCATION = _economized_exp_coefficients()
(_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11) = _EXP_COEFFS


def kernel_sums_numpy(
    targets: np.ndarray, sources: np.ndarray, log_masses: np.ndarray, A: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    r"""Reference backend: blocked numpy log-sum-exp.

    Args:
        targets: (m, d) float64, the points :math:`x_i`.
        sources: (n, d) float64, the points :math:`y_j` (:math:`n \ge 1`).
        log_masses: (n,) float64, :math:`\log m_j` (finite).
        A: (H, d, d) float64, the matrices :math:`A_h`.

    Returns:
        ``(log_Z, mean)``: log_Z (H, m) and mean (H, m, d), as in the module docstring.
    """
    m, d = targets.shape
    n = sources.shape[0]
    H = A.shape[0]
    log_Z = np.empty((H, m))
    mean = np.empty((H, m, d))
    block = max(1, BLOCK_ENTRIES // max(n, 1))
    for h in range(H):
        xA = targets @ A[h]  # row i is x_i^T A_h
        for start in range(0, m, block):
            stop = min(start + block, m)
            E = xA[start:stop] @ sources.T
            E += log_masses
            shift = E.max(axis=1, keepdims=True)
            E -= shift
            np.exp(E, out=E)
            Z = E.sum(axis=1)
            log_Z[h, start:stop] = shift[:, 0] + np.log(Z)
            mean[h, start:stop] = (E @ sources) / Z[:, None]
    return log_Z, mean


if HAVE_NUMBA:

    @intrinsic
    def _bits_to_float64(typingctx, bits):
        """Reinterpret the bits of an int64 as a float64 (an LLVM bitcast, vectorisable)."""
        if not isinstance(bits, numba_types.Integer):
            return None

        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[0], signature.args[0], numba_types.int64)
            return builder.bitcast(value, llvm_ir.DoubleType())

        return numba_types.float64(bits), codegen

    @intrinsic
    def _float64_to_bits(typingctx, value):
        """Reinterpret the bits of a float64 as an int64 (an LLVM bitcast, vectorisable)."""
        if not isinstance(value, numba_types.Float):
            return None

        def codegen(context, builder, signature, args):
            x = context.cast(builder, args[0], signature.args[0], numba_types.float64)
            return builder.bitcast(x, llvm_ir.IntType(64))

        return numba_types.int64(value), codegen

    # Only "contract" (fused multiply-add, one rounding instead of two): reassociation would
    # destroy the rounding trick (t - _SHIFTER) and the range reduction.
    @numba.njit(cache=True, fastmath={"contract"})
    def _exp_normal(x):
        """exp(x) for -708 <= x <= 1 (no range clamps): the single-pass path's exponential."""
        t = x * _LOG2E + _SHIFTER
        k = t - _SHIFTER  # round(x log2 e), exactly
        r = (x - k * _LN2_HI) - k * _LN2_LO  # |r| <= ln2/2 (+ rounding)
        p = _C11
        p = p * r + _C10
        p = p * r + _C9
        p = p * r + _C8
        p = p * r + _C7
        p = p * r + _C6
        p = p * r + _C5
        p = p * r + _C4
        p = p * r + _C3
        p = p * r + _C2
        p = p * r + _C1
        p = p * r + _C0
        return p * _bits_to_float64((_float64_to_bits(t) & 2047) << 52)  # 2^k, k + 1023 >= 1

    @numba.njit(cache=True, fastmath={"contract"})
    def _exp_nonpositive(x):
        """exp(x) for finite x <= 0, branch-free; 0 for x < -708 (relative error ~2e-16)."""
        value = _exp_normal(max(x, _EXP_CUTOFF))
        return value if x >= _EXP_CUTOFF else 0.0

    @numba.njit(cache=True)
    def _exp_nonpositive_array(x, out):
        for j in range(x.shape[0]):
            out[j] = _exp_nonpositive(x[j])

    @intrinsic
    def _maxnum(typingctx, a, b):
        """max(a, b) as ``llvm.maxnum`` (no-NaN flags): a max reduction LLVM vectorises."""
        if not (isinstance(a, numba_types.Float) and isinstance(b, numba_types.Float)):
            return None

        def codegen(context, builder, signature, args):
            double = llvm_ir.DoubleType()
            x = context.cast(builder, args[0], signature.args[0], numba_types.float64)
            y = context.cast(builder, args[1], signature.args[1], numba_types.float64)
            fnty = llvm_ir.FunctionType(double, [double, double])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.maxnum.f64")
            return builder.call(fn, [x, y], fastmath=("nnan", "nsz"))

        return numba_types.float64(a, b), codegen

    # Chunk passes. Every argument is a 1-D contiguous slice of one chunk, so each loop is a
    # unit-stride loop that LLVM vectorises. Exponents are e_j = log m_j + sum_k x_k B[k, j].

    @numba.njit(cache=True, fastmath={"contract"})
    def _exponents2(e, x0, x1, b0, b1, logm):
        mx = -np.inf
        for j in range(e.shape[0]):
            v = logm[j] + x0 * b0[j] + x1 * b1[j]
            e[j] = v
            mx = _maxnum(mx, v)
        return mx

    @numba.njit(cache=True, fastmath={"contract"})
    def _exponents3(e, x0, x1, x2, b0, b1, b2, logm):
        mx = -np.inf
        for j in range(e.shape[0]):
            v = logm[j] + x0 * b0[j] + x1 * b1[j] + x2 * b2[j]
            e[j] = v
            mx = _maxnum(mx, v)
        return mx

    @numba.njit(cache=True, fastmath={"contract"})
    def _axpy(e, a, b):
        for j in range(e.shape[0]):
            e[j] += a * b[j]

    @numba.njit(cache=True)
    def _max(e):
        mx = -np.inf
        for j in range(e.shape[0]):
            mx = _maxnum(mx, e[j])
        return mx

    # The sums are reassociated (vector partial sums: as accurate as a sequential sum, or
    # more); the weights exp(e_j - shift) lie in [0, 1] since shift >= max_j e_j.

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _moments2(e, shift, y0, y1):
        s = 0.0
        s0 = 0.0
        s1 = 0.0
        for j in range(e.shape[0]):
            w = _exp_nonpositive(e[j] - shift)
            s += w
            s0 += w * y0[j]
            s1 += w * y1[j]
        return s, s0, s1

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _moments3(e, shift, y0, y1, y2):
        s = 0.0
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        for j in range(e.shape[0]):
            w = _exp_nonpositive(e[j] - shift)
            s += w
            s0 += w * y0[j]
            s1 += w * y1[j]
            s2 += w * y2[j]
        return s, s0, s1, s2

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _exp_shift_sum(e, shift):
        s = 0.0
        for j in range(e.shape[0]):
            w = _exp_nonpositive(e[j] - shift)
            e[j] = w
            s += w
        return s

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _dot(w, y):
        s = 0.0
        for j in range(w.shape[0]):
            s += w[j] * y[j]
        return s

    # Single pass (module docstring): exponent, exponential and sums in one sweep; shift is
    # the a-priori bound M_i, so every argument lies in [-GAP_SINGLE_PASS, 0] up to rounding.

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _single_pass2(x0, x1, shift, b0, b1, logm, y0, y1):
        s = 0.0
        s0 = 0.0
        s1 = 0.0
        for j in range(b0.shape[0]):
            w = _exp_normal(logm[j] + x0 * b0[j] + x1 * b1[j] - shift)
            s += w
            s0 += w * y0[j]
            s1 += w * y1[j]
        return s, s0, s1

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def _single_pass3(x0, x1, x2, shift, b0, b1, b2, logm, y0, y1, y2):
        s = 0.0
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        for j in range(b0.shape[0]):
            w = _exp_normal(logm[j] + x0 * b0[j] + x1 * b1[j] + x2 * b2[j] - shift)
            s += w
            s0 += w * y0[j]
            s1 += w * y1[j]
            s2 += w * y2[j]
        return s, s0, s1, s2

    @numba.njit(cache=True)
    def _chunk_exponents(e, x, B, logm, h, j0, j1):
        # e <- exponents of sources j0..j1-1 for head h and target x; returns their maximum.
        d = x.shape[0]
        if d == 3:
            return _exponents3(
                e, x[0], x[1], x[2], B[h, 0, j0:j1], B[h, 1, j0:j1], B[h, 2, j0:j1], logm[j0:j1]
            )
        if d == 2:
            return _exponents2(e, x[0], x[1], B[h, 0, j0:j1], B[h, 1, j0:j1], logm[j0:j1])
        e[:] = logm[j0:j1]
        for k in range(d):
            _axpy(e, x[k], B[h, k, j0:j1])
        return _max(e)

    @numba.njit(cache=True)
    def _chunk_moments(e, shift, Y, j0, j1, acc):
        # acc[0] += sum_j w_j, acc[1 + k] += sum_j w_j Y[k, j], w_j = exp(e_j - shift).
        d = Y.shape[0]
        if d == 3:
            s, s0, s1, s2 = _moments3(e, shift, Y[0, j0:j1], Y[1, j0:j1], Y[2, j0:j1])
            acc[0] += s
            acc[1] += s0
            acc[2] += s1
            acc[3] += s2
        elif d == 2:
            s, s0, s1 = _moments2(e, shift, Y[0, j0:j1], Y[1, j0:j1])
            acc[0] += s
            acc[1] += s0
            acc[2] += s1
        else:
            acc[0] += _exp_shift_sum(e, shift)
            for k in range(d):
                acc[1 + k] += _dot(e, Y[k, j0:j1])

    @numba.njit(parallel=True, cache=True)
    def _kernel_sums_parallel(X, B, Y, logm, b_norm, log_Z, mean):
        # X (m, d) targets, B (H, d, n) with B[h, :, j] = A_h y_j, Y (d, n) sources,
        # logm (n,) log masses, b_norm (H,) = max_j |A_h y_j|; fills log_Z (H, m), mean (H, m, d).
        m, d = X.shape
        H = B.shape[0]
        n = Y.shape[1]
        logm_max = -np.inf
        logm_min = np.inf
        for j in range(n):
            logm_max = max(logm_max, logm[j])
            logm_min = min(logm_min, logm[j])
        for i in numba.prange(m):
            buffer = np.empty(SOURCE_CHUNK)
            acc = np.empty(d + 1)  # running sum of the weights, then of weights * y
            x = X[i]
            x_norm = 0.0
            for k in range(d):
                x_norm += x[k] * x[k]
            x_norm = math.sqrt(x_norm)
            for h in range(H):
                bound = x_norm * b_norm[h]
                if (d == 2 or d == 3) and (logm_max - logm_min) + 2.0 * bound <= GAP_SINGLE_PASS:
                    shift = logm_max + bound
                    if d == 3:
                        s, s0, s1, s2 = _single_pass3(
                            x[0],
                            x[1],
                            x[2],
                            shift,
                            B[h, 0],
                            B[h, 1],
                            B[h, 2],
                            logm,
                            Y[0],
                            Y[1],
                            Y[2],
                        )
                        mean[h, i, 2] = s2 / s
                    else:
                        s, s0, s1 = _single_pass2(
                            x[0], x[1], shift, B[h, 0], B[h, 1], logm, Y[0], Y[1]
                        )
                    log_Z[h, i] = shift + math.log(s)
                    mean[h, i, 0] = s0 / s
                    mean[h, i, 1] = s1 / s
                    continue
                shift = -np.inf
                acc[:] = 0.0
                for j0 in range(0, n, SOURCE_CHUNK):
                    j1 = min(j0 + SOURCE_CHUNK, n)
                    e = buffer[: j1 - j0]
                    cmax = _chunk_exponents(e, x, B, logm, h, j0, j1)
                    if cmax > shift:  # online log-sum-exp: move the shift up, rescale sums
                        acc *= math.exp(shift - cmax)  # 0 on the first chunk
                        shift = cmax
                    _chunk_moments(e, shift, Y, j0, j1, acc)
                log_Z[h, i] = shift + math.log(acc[0])
                for k in range(d):
                    mean[h, i, k] = acc[1 + k] / acc[0]


def kernel_sums_numba(
    targets: np.ndarray, sources: np.ndarray, log_masses: np.ndarray, A: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    r"""Compiled backend (numba ``prange`` over targets), same contract as the numpy one.

    Precomputes :math:`B_h = Y A_h^T` as an :math:`(H, d, n)` array (:math:`O(H d n)` memory).
    """
    if not HAVE_NUMBA:  # pragma: no cover
        raise RuntimeError("the numba backend needs numba, which is not importable")
    m, d = targets.shape
    H = A.shape[0]
    X = np.ascontiguousarray(targets, dtype=np.float64)
    Yt = np.ascontiguousarray(sources.T, dtype=np.float64)
    B = np.ascontiguousarray(np.einsum("hkl,jl->hkj", A, sources), dtype=np.float64)
    logm = np.ascontiguousarray(log_masses, dtype=np.float64)
    b_norm = np.sqrt(np.max(np.einsum("hkj,hkj->hj", B, B), axis=1)) if len(logm) else np.zeros(H)
    log_Z = np.empty((H, m))
    mean = np.empty((H, m, d))
    if m > 0:
        _kernel_sums_parallel(*read_only(X, B, Yt, logm, b_norm), log_Z, mean)
    return log_Z, mean


def exp_nonpositive_array(x: np.ndarray) -> np.ndarray:
    r"""The numba kernel's vectorised exponential applied elementwise, for testing.

    Returns :math:`e^x` for finite :math:`x \le 0`, to about 2e-16 relative error, and 0 for
    :math:`x < -708`. Range reduction :math:`x = k \ln 2 + r` with :math:`k` the integer nearest
    :math:`x \log_2 e` (rounded by adding :math:`1.5 \cdot 2^{52}`), :math:`|r| \le \ln 2 / 2`
    (``ln 2`` split in a high and a low part), a degree-11 Chebyshev-economised polynomial for
    :math:`e^r` (truncation error 3.5e-18), and :math:`2^k` built from its IEEE bits.
    """
    if not HAVE_NUMBA:  # pragma: no cover
        raise RuntimeError("exp_nonpositive_array needs numba, which is not importable")
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    out = np.empty_like(x)
    _exp_nonpositive_array(x, out)
    return out
