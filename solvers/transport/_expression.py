"""Density expressions as data: parsed, checked against a whitelist, evaluated by a tree walk.

A config's ``[initial] density`` is a string such as ``"exp(3 * x[2]) + 0.3"``. It is never
handed to ``eval``: Python's ``eval`` with empty builtins is not a sandbox (the subclasses of
``object`` are one attribute chain away from ``os.system``). Instead the string is parsed
into a syntax tree (:func:`ast.parse`), every node is checked against the grammar below, and
the tree is evaluated by :class:`Expression` itself on float64 numpy arrays.

Grammar (anything else is refused with a message naming the construct):

- numbers: int and float literals (no complex, strings, bools, None); ints beyond float64
  are refused;
- the coordinates ``x[i]``: the name ``x`` subscripted by an integer literal 0 <= i < d
  (d = 2 on S^1 and R^2, 3 on S^2, 1 on R^1);
- the constants :data:`CONSTANTS` (``pi``, ``e``);
- ``+ - * / ** % //``, unary ``+ -``, one comparison ``< <= > >= == !=`` (a 0/1 value, e.g.
  inside ``where``);
- calls of the functions :data:`FUNCTIONS` by their bare name, positional arguments only, with
  the number of arguments each takes.

No attribute access, no other names, no subscripts of anything but ``x``, no comprehensions,
lambdas, conditional expressions, f-strings, starred or keyword arguments. Size limits:
:data:`MAX_LENGTH` characters, :data:`MAX_NODES` nodes, :data:`MAX_DEPTH` levels of nesting.
All arithmetic is float64 with numpy's rules (``10 ** 400`` is inf, not a big integer; every
operand is an array of the points' shape or a scalar, so memory is bounded by the points), and
floating-point warnings are silenced: the caller checks the values (non-finite, negative).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["CONSTANTS", "FUNCTIONS", "MAX_LENGTH", "Expression", "ExpressionError"]

Array = npt.NDArray[np.float64]

#: name -> (numpy function, allowed numbers of arguments)
FUNCTIONS: dict[str, tuple[Callable[..., Array], tuple[int, ...]]] = {
    **{
        name: (getattr(np, name), (1,))
        for name in (
            "exp",
            "log",
            "log1p",
            "expm1",
            "sqrt",
            "sin",
            "cos",
            "tan",
            "arcsin",
            "arccos",
            "arctan",
            "sinh",
            "cosh",
            "tanh",
            "abs",
            "sign",
            "ones_like",
            "zeros_like",
        )
    },
    **{
        name: (getattr(np, name), (2,))
        for name in ("arctan2", "maximum", "minimum", "heaviside", "power", "hypot")
    },
    "where": (np.where, (3,)),
    "clip": (np.clip, (3,)),
}
#: name -> value
CONSTANTS = {"pi": np.pi, "e": np.e}
#: longest expression accepted (characters)
MAX_LENGTH = 2000
#: most syntax-tree nodes accepted
MAX_NODES = 1000
#: deepest nesting accepted
MAX_DEPTH = 60

_BINARY = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.true_divide,
    ast.Pow: np.power,
    ast.Mod: np.mod,
    ast.FloorDiv: np.floor_divide,
}
_UNARY = {ast.UAdd: np.positive, ast.USub: np.negative}
_COMPARE = {
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
}
_WHAT = {
    ast.Attribute: "attribute access",
    ast.Lambda: "a lambda",
    ast.IfExp: "a conditional expression",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a comprehension",
    ast.JoinedStr: "an f-string",
    ast.Starred: "a starred argument",
    ast.BoolOp: "'and'/'or'",
    ast.NamedExpr: "an assignment expression",
    ast.List: "a list",
    ast.Tuple: "a tuple",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "a slice",
}


class ExpressionError(ValueError):
    """An expression that is not in the grammar (the message names what is not allowed)."""


def _short(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters for a one-line message."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _allowed() -> str:
    return (
        "allowed: numbers, x[i], pi, e, + - * / ** % //, one comparison, and the functions "
        + ", ".join(sorted(FUNCTIONS))
    )


class Expression:
    """A checked density expression in the coordinates ``x[0..d-1]`` (module docstring).

    Args:
        text: the expression.
        d: the number of coordinates.

    Raises:
        ExpressionError: the text is not in the grammar (syntax, a construct or name that is
            not allowed, a size limit); nothing of it has been evaluated.
    """

    def __init__(self, text: str, d: int) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ExpressionError("density must be a non-empty string expression")
        if len(text) > MAX_LENGTH:
            raise ExpressionError(
                f"the expression has {len(text)} characters (at most {MAX_LENGTH})"
            )
        self.text, self.d = text, int(d)
        self._quoted = repr(_short(text))
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"invalid expression {self._quoted}: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:
            raise ExpressionError(f"invalid expression {self._quoted}: {exc}") from None
        self._nodes = 0
        self._check(tree.body, 1)
        self._tree = tree.body

    # ------------------------------------------------------------------ checking
    def _refuse(self, what: str) -> ExpressionError:
        return ExpressionError(f"{self._quoted}: {what} is not allowed ({_allowed()})")

    def _check(self, node: ast.AST, depth: int) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ExpressionError(f"{self._quoted}: more than {MAX_NODES} terms")
        if depth > MAX_DEPTH:
            raise ExpressionError(f"{self._quoted}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, ast.Constant):
            self._constant(node)
        elif isinstance(node, ast.Name):
            if node.id not in CONSTANTS:
                hint = " (write x[0], x[1], ...)" if node.id == "x" else ""
                raise self._refuse(f"the name {node.id!r}{hint}")
        elif isinstance(node, ast.Subscript):
            self._coordinate(node)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self._check(node.left, depth + 1)
            self._check(node.right, depth + 1)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            self._check(node.operand, depth + 1)
        elif isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
                raise self._refuse("a chained or non-numeric comparison")
            self._check(node.left, depth + 1)
            self._check(node.comparators[0], depth + 1)
        elif isinstance(node, ast.Call):
            self._call(node, depth)
        else:
            what = _WHAT.get(type(node), f"the construct {type(node).__name__}")
            if isinstance(node, (ast.BinOp, ast.UnaryOp)):
                what = f"the operator {type(node.op).__name__}"
            raise self._refuse(what)

    def _constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(f"the literal {value!r}")
        if isinstance(value, int):
            try:
                float(value)
            except OverflowError:
                raise ExpressionError(
                    f"{self._quoted}: the integer literal of {len(str(value))} digits is beyond "
                    "float64"
                ) from None

    def _coordinate(self, node: ast.Subscript) -> None:
        if not (isinstance(node.value, ast.Name) and node.value.id == "x"):
            raise self._refuse("a subscript of anything but x")
        index = node.slice
        ok = isinstance(index, ast.Constant) and type(index.value) is int
        if not ok or not 0 <= index.value < self.d:
            raise ExpressionError(
                f"{self._quoted}: the coordinates are x[0] .. x[{self.d - 1}] (a literal "
                f"index), got x[{ast.unparse(index)}]"
            )

    def _call(self, node: ast.Call, depth: int) -> None:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise self._refuse(f"calling {_short(ast.unparse(node.func), 40)!r}")
        if node.keywords:
            raise self._refuse("a keyword argument")
        arity = FUNCTIONS[node.func.id][1]
        if len(node.args) not in arity:
            raise ExpressionError(
                f"{self._quoted}: {node.func.id} takes {' or '.join(map(str, arity))} "
                f"argument(s), got {len(node.args)}"
            )
        for arg in node.args:
            self._check(arg, depth + 1)

    # ------------------------------------------------------------------ evaluation
    def __call__(self, x: Array) -> Array:
        """The values at the points ``x`` of shape (d, n): an array of shape (n,).

        Raises:
            ExpressionError: ``x`` has the wrong shape.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != self.d:
            raise ExpressionError(f"expected points of shape ({self.d}, n), got {x.shape}")
        with np.errstate(all="ignore"):
            value = self._evaluate(self._tree, x)
            return np.broadcast_to(np.asarray(value, dtype=np.float64), x.shape[1:]).copy()

    def _evaluate(self, node: ast.AST, x: Array):  # noqa: ANN202 (array or scalar)
        if isinstance(node, ast.Constant):
            return np.float64(node.value)
        if isinstance(node, ast.Name):
            return np.float64(CONSTANTS[node.id])
        if isinstance(node, ast.Subscript):
            return x[node.slice.value]  # type: ignore[attr-defined]
        if isinstance(node, ast.BinOp):
            left, right = self._evaluate(node.left, x), self._evaluate(node.right, x)
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._evaluate(node.operand, x))
        if isinstance(node, ast.Compare):
            left = self._evaluate(node.left, x)
            right = self._evaluate(node.comparators[0], x)
            return _COMPARE[type(node.ops[0])](left, right).astype(np.float64)
        assert isinstance(node, ast.Call)
        function = FUNCTIONS[node.func.id][0]  # type: ignore[attr-defined]
        return function(*(self._evaluate(arg, x) for arg in node.args))
