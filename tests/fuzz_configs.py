"""Strategies for tests/test_config_fuzz.py: random TOML configs for the input contract.

Hypothesis strategies that write configs, valid and invalid: random sections and keys, wrong
types, out-of-range and non-finite numbers, matrices of random and wrong shapes with entries
up to 1e308, density expressions from a small grammar (valid, negative, zero, non-finite and
malformed ones), meshes read from files, every scheme, and ``--set`` overrides. A generated
:class:`Case` is a TOML document plus overrides; ``MESHDIR`` in it stands for the folder of
prepared mesh files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

#: placeholder for the folder of prepared mesh files in generated configs
MESHDIR = "@MESHDIR@"

SECTIONS = ("mesh", "attention", "weights", "initial", "time", "transport", "output")
#: the prepared mesh files (written by the fuzz_dir fixture of test_config_fuzz.py)
MESH_FILES = (
    "ico.vtk",
    "flipped.vtk",
    "off_sphere.vtk",
    "duplicate.vtk",
    "circle.vtk",
    "garbage.msh",
    "empty.stl",
    "notes.txt",
    "function.xdmf",
)


# --------------------------------------------------------------------------- TOML writing
def toml_value(v: object) -> str:
    """A TOML literal for the values the strategies produce (str, bool, int, float, list, dict)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def toml_document(doc: dict[str, object]) -> str:
    lines = []
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
        else:  # a top-level key where a table belongs
            lines.insert(0, f"{json.dumps(name)} = {toml_value(table)}")
    return "\n".join(lines) + "\n"


@dataclass
class Case:
    """One generated command line: the config file's content and the --set overrides."""

    text: str | bytes
    overrides: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"Case(text={self.text!r}, overrides={self.overrides!r})"


def case(doc: dict[str, object], *overrides: str) -> Case:
    return Case(toml_document(doc), list(overrides))


# --------------------------------------------------------------------------- strategies
ASCII = st.characters(min_codepoint=32, max_codepoint=126)
junk_text = st.text(ASCII, max_size=12)
junk_name = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
JUNK_SCALARS = st.one_of(
    junk_text,
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just([]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.just({"a": 1}),
)
HUGE = st.sampled_from([1e100, 1e200, 1e308, -1e308, 1.7976931348623157e308])
TINY = st.sampled_from([1e-300, 5e-324, 1e-12])
#: CFL numbers that collapse the step at once (1e-12 would be a legitimate, hours-long run)
TINY_CFL = st.sampled_from([1e-300, 5e-324])


def pick(draw, valid, edge=None, junk=JUNK_SCALARS, mode="mixed"):
    """A value: valid, edge (valid type, extreme size) or junk, weighted by the mode.

    Modes: "valid" (moderate valid values only), "edge" (valid types, 40% extreme values),
    "mixed" (mostly valid, 5% extreme, 10% junk: usually one or two bad keys per config).
    """
    r = draw(st.integers(0, 19))
    if mode == "valid" or (mode == "edge" and edge is None):
        return draw(valid)
    if mode == "edge":
        return draw(edge) if r < 8 else draw(valid)
    if r < 2 and junk is not None:
        return draw(junk)
    if r < 3 and edge is not None:
        return draw(edge)
    return draw(valid)


def matrices(d: int, mode: str):
    """Q, K or V: "identity", d x d (moderate or huge entries), wrong shapes, junk."""
    moderate = st.lists(
        st.lists(st.floats(-3, 3, allow_nan=False), min_size=d, max_size=d), min_size=d, max_size=d
    )
    huge = st.lists(
        st.lists(st.one_of(st.floats(-3, 3), HUGE), min_size=d, max_size=d), min_size=d, max_size=d
    )
    wrong = st.one_of(
        st.lists(
            st.lists(st.floats(-3, 3), min_size=d + 1, max_size=d + 1),
            min_size=d + 1,
            max_size=d + 1,
        ),
        st.lists(st.lists(st.floats(-3, 3), min_size=1, max_size=4), min_size=1, max_size=4),
        st.lists(st.floats(-3, 3), max_size=4),
        st.just([[]]),
        st.lists(st.lists(junk_text, min_size=d, max_size=d), min_size=d, max_size=d),
        st.lists(
            st.lists(st.sampled_from([float("nan"), float("inf")]), min_size=d, max_size=d),
            min_size=d,
            max_size=d,
        ),
        st.sampled_from(["eye", "Identity", "", "I"]),
    )
    if mode == "valid":
        return st.one_of(st.just("identity"), moderate)
    if mode == "edge":
        return st.one_of(st.just("identity"), moderate, huge, huge)
    return st.one_of(st.just("identity"), moderate, moderate, huge, wrong)


@st.composite
def symmetric_heads(draw, d: int, mode: str):
    """Heads with Q^T K = V symmetric (what ou/oscillating weights with init='config' need);
    sometimes only nearly so (V off by a relative 1e-7) or with huge entries."""
    a = np.array(draw(st.lists(st.floats(-2, 2), min_size=d * d, max_size=d * d))).reshape(d, d)
    S = (a + a.T) / 2
    if mode == "edge" and draw(st.booleans()):
        with np.errstate(over="ignore"):
            S = S * draw(HUGE)
    V = S.copy()
    if draw(st.integers(0, 3)) == 0:
        V[0, 0] = V[0, 0] * (1 + 1e-7) + 1e-7  # Q^T K = V only up to allclose's rtol
    return {"Q": "identity", "K": S.tolist(), "V": V.tolist()}


def heads(d: int, mode: str):
    head_keys = ("Q", "K", "V") if mode != "mixed" else ("Q", "K", "V", "V", "W")
    head = st.dictionaries(st.sampled_from(head_keys), matrices(d, mode), max_size=3)
    valid = st.lists(st.one_of(head, symmetric_heads(d, mode)), min_size=1, max_size=3)
    junk = st.one_of(st.just([]), st.just("identity"), st.lists(st.integers(), max_size=2))
    return valid if mode != "mixed" else st.one_of(valid, valid, valid, valid, junk)


# the density grammar: atoms, unary and binary operations, functions; then malformations
ATOMS_COMMON = ["x[0]", "x[1]", "1", "2", "0.5", "3.0", "pi", "e"]
ATOMS_EDGE = ["x[2]", "x[3]", "x[-1]", "0", "-1", "1e308", "5e-324", "x", "y", "np.pi"]
FUNCS = ["exp", "log", "sqrt", "sin", "cos", "abs", "tanh", "arcsin", "cosh", "expm1"]
FUNCS2 = ["maximum", "minimum", "arctan2", "power", "hypot"]


def density_expressions(d: int, mode: str):
    atoms = ATOMS_COMMON + (["x[2]"] if d == 3 else [])
    if mode != "valid":
        atoms = atoms + ATOMS_EDGE
    leaf = st.sampled_from(atoms)

    def extend(inner):
        return st.one_of(
            st.tuples(st.sampled_from(["-", "+"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            st.tuples(st.sampled_from(FUNCS), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(st.sampled_from(FUNCS2), inner, inner).map(
                lambda t: f"{t[0]}({t[1]}, {t[2]})"
            ),
            st.tuples(inner, inner, inner).map(lambda t: f"where({t[0]} > 0, {t[1]}, {t[2]})"),
        )

    expr = st.recursive(leaf, extend, max_leaves=6)
    positive = expr.map(lambda s: f"1.5 + 0.5 * sin({s})")  # mostly valid: in [1, 2]
    if mode == "valid":
        return st.one_of(positive, positive, expr)
    extreme = st.sampled_from(
        [
            "1e308 * (2 + x[0])",  # finite values, infinite total mass
            "1e300 * (1.5 + x[1])",
            "5e-324 * (2 + x[0])",  # subnormal values
            "1e-310 + 0 * x[0]",
            "exp(700 * x[0])",
            "exp(-700 * x[0])",
            "where(x[0] > 0.99, 1, 0)",  # support in a few cells (or none)
            "where(x[0] > 2, 1, 0)",
            "0 * x[0]",
            "-1 + 0 * x[0]",
            "log(x[0])",
            "exp(1000 * x[0])",
            "1e308 ** 2",
        ]
    )
    if mode == "edge":
        return st.one_of(positive, expr, extreme)
    broken = st.one_of(
        expr.map(lambda s: s[:-1] if len(s) > 1 else "("),  # unbalanced
        expr.map(lambda s: f"foo({s})"),
        expr.map(lambda s: f"{s} +"),
        st.sampled_from(
            [
                "",
                "   ",
                "__import__('os')",
                "x.__class__",
                "np.ones(5)",
                "lambda: 1",
                "[1, 2]",
                "'text'",
                "x[0] if x[0] > 0 else 1",
                "1 / 0",
                "0 ** -1",
                "nan",
                "x[0] + 1j",
                "x[0] > 0",
                # code-execution payloads: refused by the grammar (exit 2), never run
                "().__class__.__base__.__subclasses__()",
                "[c for c in ().__class__.__mro__]",
                "exp.__globals__",
                "x[0].__array_interface__",
                "(lambda: 1)()",
                "__builtins__",
                "getattr(x, 'T')",
                "f'{x}'",
                "x[0:2]",
                "(y := 2) * x[0]",
                "exp(*x)",
                "where(x[0] > 0, x=1, y=0)",
                "9" * 400,
                "exp(" * 80 + "x[0]" + ")" * 80,
            ]
        ),
        st.tuples(
            expr,
            st.sampled_from(
                [".__class__", ".__dict__", "[0].__globals__", ".real", "(*x)", "(**{})"]
            ),
        ).map(lambda t: f"({t[0]}){t[1]}"),
        JUNK_SCALARS.filter(lambda v: not isinstance(v, str)),
    )
    return st.one_of(positive, expr, extreme, broken)


@st.composite
def documents(draw) -> dict[str, object]:
    mode = draw(st.sampled_from(["valid", "edge", "mixed", "mixed"]))
    doc: dict[str, dict[str, object]] = {s: {} for s in SECTIONS}

    def maybe(p_percent: int = 60) -> bool:
        return draw(st.integers(0, 99)) < p_percent

    manifold = pick(
        draw, st.sampled_from(["S1", "S2"]), junk=st.sampled_from(["S3", "s2", 2, ""]), mode=mode
    )
    doc["mesh"]["manifold"] = manifold
    d = 2 if manifold == "S1" else 3
    # refinement: always set (the default, 3, is not tiny); junk never a valid large level
    ref_valid = st.integers(0, 2 if manifold == "S1" else 1)
    ref_junk = st.sampled_from([-1, 17, 99, 2**70, 2.5, "1", True, 1.0])
    doc["mesh"]["refinement"] = pick(draw, ref_valid, junk=ref_junk, mode=mode)
    if mode == "mixed" and maybe(15):
        doc["mesh"]["file"] = draw(
            st.one_of(
                st.sampled_from(
                    [f"{MESHDIR}/{name}" for name in MESH_FILES] + ["", "/no/such/file.msh"]
                ),
                JUNK_SCALARS,
            )
        )

    a = doc["attention"]
    if maybe():
        a["beta"] = pick(
            draw,
            st.floats(0.1, 20),
            edge=st.one_of(HUGE.filter(lambda v: v > 0), TINY),
            junk=st.one_of(
                st.sampled_from([0.0, -1.0, float("nan"), float("inf"), "big"]), JUNK_SCALARS
            ),
            mode=mode,
        )
    if maybe():
        a["sign"] = pick(
            draw,
            st.sampled_from([1, -1]),
            junk=st.sampled_from([0, 2, 1.0, -1.0, "1", True]),
            mode=mode,
        )
    dynamics = pick(
        draw,
        st.sampled_from(["frozen", "ou", "oscillating"]),
        junk=st.sampled_from(["OU", "sde", ""]),
        mode=mode,
    )
    if maybe(80):
        a["heads"] = draw(heads(d, mode))
    if maybe(20):
        a["backend"] = pick(
            draw,
            st.sampled_from(["auto", "numba", "numpy"]),
            junk=st.sampled_from(["cuda", ""]),
            mode=mode,
        )

    w = doc["weights"]
    if dynamics != "frozen" or maybe(20):
        w["dynamics"] = dynamics
    if maybe(40):
        w["init"] = pick(draw, st.sampled_from(["config", "random"]), junk=junk_text, mode=mode)
    if maybe(30):
        w["seed"] = pick(
            draw, st.integers(0, 2**63 - 1), junk=st.sampled_from([-1, 1.5, "0", 2**70]), mode=mode
        )
    if maybe(30):
        w["sigma"] = pick(
            draw,
            st.floats(0, 3),
            edge=HUGE.filter(lambda v: v > 0),
            junk=st.sampled_from([-1.0, float("nan"), "x"]),
            mode=mode,
        )
    if maybe(30):
        w["dt"] = pick(
            draw,
            st.floats(1e-3, 0.1),
            edge=TINY,
            junk=st.sampled_from([0.0, -1.0, float("inf"), "x"]),
            mode=mode,
        )

    if maybe(85):
        doc["initial"]["density"] = draw(density_expressions(d, mode))

    t = doc["time"]
    scheme = pick(
        draw,
        st.sampled_from(["fv", "fv", "particles", "jko"]),
        junk=st.sampled_from(["rk4", "FV", ""]),
        mode=mode,
    )
    t["scheme"] = scheme
    t["t_end"] = pick(
        draw,
        st.floats(1e-3, 0.05),
        edge=TINY,
        junk=st.sampled_from([0.0, -1.0, float("nan"), float("inf"), "1", True]),
        mode=mode,
    )
    if maybe(40):
        t["cfl"] = pick(
            draw,
            st.floats(0.05, 0.5),
            edge=TINY_CFL,
            junk=st.sampled_from([0.0, 0.9, 2.0, -0.1, float("nan"), "x"]),
            mode=mode,
        )
    if scheme in ("jko", "particles") and maybe(70) or maybe(20):
        t["dt"] = pick(
            draw,
            st.one_of(st.just(0.0), st.floats(2e-3, 0.05)),
            edge=TINY,
            junk=st.sampled_from([-1.0, float("nan"), "x"]),
            mode=mode,
        )
    if maybe(20):
        t["rk"] = pick(
            draw,
            st.sampled_from(["", "ssp3", "ssp2", "euler", "rk4"]),
            junk=st.sampled_from(["rk45", 4]),
            mode=mode,
        )
    if maybe(30):
        doc["transport"]["reconstruction"] = pick(
            draw, st.sampled_from(["muscl", "upwind"]), junk=st.sampled_from(["weno", 1]), mode=mode
        )

    o = doc["output"]
    if maybe(50):
        o["every"] = pick(
            draw,
            st.integers(1, 5),
            edge=st.just(2**63 - 1),
            junk=st.sampled_from([0, -1, 1.5, "1"]),
            mode=mode,
        )
    if maybe(20):
        o["progress"] = pick(draw, st.floats(-10, 10), junk=st.sampled_from(["x", [1]]), mode=mode)
    if maybe(20):
        o["checkpoint_every"] = pick(
            draw, st.integers(0, 3), junk=st.sampled_from([-1, 0.5]), mode=mode
        )

    if mode == "mixed" and maybe(15):  # unknown sections and keys
        target = draw(st.sampled_from([*SECTIONS, "bogus", "Mesh", ""]))
        doc.setdefault(target, {})
        if isinstance(doc[target], dict):
            doc[target][draw(junk_name)] = draw(JUNK_SCALARS)
    if mode == "mixed" and maybe(5):  # a section that is not a table
        doc[draw(st.sampled_from(SECTIONS))] = draw(JUNK_SCALARS)
    return {k: v for k, v in doc.items() if v != {}}


OVERRIDES = st.one_of(
    st.sampled_from(
        [
            "mesh.refinement=0",
            'time.scheme="particles"',
            'transport.reconstruction="upwind"',
            "attention.sign=-1",
            "output.every=1",
            "time.t_end=0.01",
            'initial.density="2 + x[1]"',
            'mesh.manifold="S1"',
            "beta=2",
            "=",
            "mesh.=1",
            ".x=1",
            "mesh.refinement=",
            "mesh.refinement=[1, 2",
            "attention.heads={}",
            "time.t_end=-1",
            "time.t_end=nan",
            "weights.dt=1e-300",
        ]
    ),
    st.tuples(st.sampled_from(SECTIONS), junk_name, junk_text).map(
        lambda t: f"{t[0]}.{t[1]}={t[2]}"
    ),
    junk_text,
)


@st.composite
def cases(draw) -> Case:
    kind = draw(st.integers(0, 19))
    if kind == 0:  # not TOML at all
        return Case(draw(st.sampled_from(["this is not toml", "[mesh", "a = ", "[[x]]\n[x]"])))
    if kind == 1:  # not UTF-8
        return Case(b'[mesh]\nmanifold = "\xff\xfe"\n')
    overrides = draw(st.lists(OVERRIDES, max_size=2)) if draw(st.integers(0, 4)) == 0 else []
    return Case(toml_document(draw(documents())), overrides)
