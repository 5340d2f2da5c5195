"""Local derivatives of checked TC expressions: reverse mode over one expression tree.

:func:`partials` walks a typed right-hand side from the root down, carrying the cotangent
``g`` of the node it is at, and returns, for every tensor read whose value may depend on a
differentiated input, the expression its cotangent receives. New nodes are built untyped: the
backward def is printed as TC source and checked again by sema, which types them.

Rules follow PyTorch's derivative formulas (``tools/autograd/derivatives.yaml``) where PyTorch
defines them, so that NaN and inf appear in the same places: ``log(0)`` gives ``g/0``, ``max(a,
b)`` splits the cotangent in halves on a tie, ``fmax`` gives it all to its first argument,
``pow(x, 0)`` gives zero. A ternary sends the cotangent down the branch taken only (TC's
ternaries are lazy, so the other branch's derivative is never evaluated). Constants are built
from integers (``acos(float(-1))`` is pi) so that they are exact in the expression's own type:
TC's float literals are float32.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..lang import ast
from ..lang.types import ScalarType

__all__ = ["NotDifferentiable", "partials", "mul", "add", "neg", "div", "ternary", "conj", "ONE", "ZERO"]

ONE = ast.IntLit(1)
ZERO = ast.IntLit(0)


class NotDifferentiable(Exception):
    """An operation on a differentiated value that has no derivative (``%``, ``lgamma``...)."""

    def __init__(self, node: ast.Expr, why: str):
        super().__init__(why)
        self.node = node
        self.why = why


# ----------------------------------------------------------------------------- builders
# Small simplifications keep the printed backward readable (and let the contraction engine see
# `dC(m, n) * B(k, n)`, not `dC(m, n) * 1 * B(k, n)`).


def _is_literal(e: ast.Expr, value) -> bool:
    return isinstance(e, (ast.IntLit, ast.FloatLit)) and e.value == value


def mul(a: Optional[ast.Expr], b: Optional[ast.Expr]) -> ast.Expr:
    """``a * b``; None stands for 1."""
    if a is None or _is_literal(a, 1):
        return ONE if b is None else b
    if b is None or _is_literal(b, 1):
        return a
    if _is_literal(a, 0) or _is_literal(b, 0):
        return ZERO
    if isinstance(b, ast.Unary) and b.op == "-":
        return neg(ast.Binary("*", a, b.operand))
    return ast.Binary("*", a, b)


def div(a: Optional[ast.Expr], b: ast.Expr) -> ast.Expr:
    """``a / b``; None stands for 1."""
    return ast.Binary("/", ONE if a is None else a, b)


def add(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    """``a + b``, dropping literal zeros."""
    if _is_literal(a, 0):
        return b
    if _is_literal(b, 0):
        return a
    if isinstance(b, ast.Unary) and b.op == "-":
        return ast.Binary("-", a, b.operand)
    return ast.Binary("+", a, b)


def neg(a: ast.Expr) -> ast.Expr:
    """``-a``."""
    if isinstance(a, ast.Unary) and a.op == "-":
        return a.operand
    if _is_literal(a, 0):
        return a
    return ast.Unary("-", a)


def ternary(cond: ast.Expr, then: ast.Expr, other: ast.Expr) -> ast.Expr:
    """``cond ? then : other``."""
    return ast.Ternary(cond, then, other)


def conj(a: Optional[ast.Expr], b: Optional[ast.Expr]) -> Optional[ast.Expr]:
    """``a && b``; None stands for true."""
    if a is None:
        return b
    if b is None:
        return a
    return ast.Binary("&&", a, b)


def _cmp(op: str, a: ast.Expr, b: ast.Expr) -> ast.Expr:
    return ast.Binary(op, a, b)


def _const(t: ScalarType, value: int) -> ast.Expr:
    """An integer constant in type ``t`` (exact: TC's float literals are float32)."""
    return ast.Cast(t, ast.IntLit(value)) if value >= 0 else neg(ast.Cast(t, ast.IntLit(-value)))


def _pi(t: ScalarType) -> ast.Expr:
    return ast.Call("acos", (_const(t, -1),))


def _square(x: ast.Expr) -> ast.Expr:
    return ast.Binary("*", x, x)


def _only_if(cond: ast.Expr, g: Optional[ast.Expr]) -> ast.Expr:
    return ternary(cond, ONE if g is None else g, ZERO)


# ----------------------------------------------------------------------------- rules
# Each rule maps (g, args, call, type) to the cotangents of the arguments (None: no derivative
# flows, e.g. to the second argument of copysign). `call` is the call itself: its value is
# recomputed element-wise where a derivative needs it (exp's derivative is exp).

Rule = Callable[[Optional[ast.Expr], tuple, ast.Expr, ScalarType], tuple]


def _unary(fn: Callable[[Optional[ast.Expr], ast.Expr, ast.Expr, ScalarType], ast.Expr]) -> Rule:
    return lambda g, args, y, t: (fn(g, args[0], y, t),)


def _sign(x: ast.Expr) -> ast.Expr:
    return ternary(_cmp(">", x, ZERO), ONE, ternary(_cmp("<", x, ZERO), neg(ONE), ZERO))


def _max_rule(keep_first: str) -> Rule:
    """``max``/``min`` (TC's operators): as PyTorch's maximum/minimum, a tie splits the cotangent."""
    lose_first = "<" if keep_first == ">" else ">"

    def rule(g, args, y, t):
        a, b = args
        half = ternary(_cmp("==", a, b), div(g, _const(t, 2)), ONE if g is None else g)
        return (ternary(_cmp(lose_first, a, b), ZERO, half), ternary(_cmp(keep_first, a, b), ZERO, half))
    return rule


def _fmax_rule(op: str) -> Rule:
    """``fmax``/``fmin``: as PyTorch, the first argument takes it all on a tie or a NaN second."""
    def rule(g, args, y, t):
        a, b = args
        first = ast.Binary("||", _cmp(op, a, b), _cmp("!=", b, b))
        return (_only_if(first, g), ternary(first, ZERO, ONE if g is None else g))
    return rule


def _pow_rule(g, args, y, t):
    a, b = args
    # PyTorch: zero where the exponent is 0; zero for the exponent where a == 0 and b >= 0
    d_base = ternary(_cmp("==", b, ZERO), ZERO, mul(g, mul(b, ast.Call("pow", (a, ast.Binary("-", b, ONE))))))
    d_exp = ternary(ast.Binary("&&", _cmp("==", a, ZERO), _cmp(">=", b, ZERO)), ZERO,
                    mul(g, mul(y, ast.Call("log", (a,)))))
    return d_base, d_exp


def _atan2_rule(g, args, y, t):
    a, b = args
    norm = ast.Binary("+", _square(a), _square(b))
    return mul(g, div(b, norm)), neg(mul(g, div(a, norm)))


def _hypot_rule(g, args, y, t):
    return tuple(mul(g, div(x, y)) for x in args)


def _rhypot_rule(g, args, y, t):
    cube = ast.Binary("*", ast.Binary("*", y, y), y)
    return tuple(neg(mul(g, mul(x, cube))) for x in args)


def _division_rule(g, args, y, t):
    a, b = args
    return div(g, b), neg(mul(g, div(div(a, b), b)))


def _fmod_rule(g, args, y, t):
    a, b = args
    return ONE if g is None else g, neg(mul(g, ast.Call("trunc", (div(a, b),))))


def _remainder_rule(g, args, y, t):
    a, b = args  # a - n*b with n = a/b rounded to nearest: the cotangent of b is -n
    return ONE if g is None else g, neg(mul(g, div(ast.Binary("-", a, y), b)))


def _copysign_rule(g, args, y, t):
    a, _ = args
    return ternary(_cmp("==", a, ZERO), ZERO, mul(g, div(y, a))), None


def _fdim_rule(g, args, y, t):
    a, b = args
    return _only_if(_cmp(">", a, b), g), ternary(_cmp(">", a, b), neg(ONE if g is None else g), ZERO)


def _fma_rule(g, args, y, t):
    a, b, _ = args
    return mul(g, b), mul(g, a), ONE if g is None else g


def _zero(g, x, y, t):
    return ZERO


RULES: dict[str, Rule] = {
    "exp": _unary(lambda g, x, y, t: mul(g, y)),
    "exp2": _unary(lambda g, x, y, t: mul(g, mul(y, ast.Call("log", (_const(t, 2),))))),
    "exp10": _unary(lambda g, x, y, t: mul(g, mul(y, ast.Call("log", (_const(t, 10),))))),
    "expm1": _unary(lambda g, x, y, t: mul(g, ast.Binary("+", y, ONE))),
    "log": _unary(lambda g, x, y, t: div(g, x)),
    "log2": _unary(lambda g, x, y, t: div(g, ast.Binary("*", x, ast.Call("log", (_const(t, 2),))))),
    "log10": _unary(lambda g, x, y, t: div(g, ast.Binary("*", x, ast.Call("log", (_const(t, 10),))))),
    "log1p": _unary(lambda g, x, y, t: div(g, ast.Binary("+", x, ONE))),
    "sqrt": _unary(lambda g, x, y, t: div(g, ast.Binary("*", _const(t, 2), y))),
    "rsqrt": _unary(lambda g, x, y, t: neg(mul(g, div(ast.Binary("*", ast.Binary("*", y, y), y), _const(t, 2))))),
    "cbrt": _unary(lambda g, x, y, t: div(g, ast.Binary("*", _const(t, 3), ast.Binary("*", y, y)))),
    "rcbrt": _unary(lambda g, x, y, t: neg(mul(g, div(y, ast.Binary("*", _const(t, 3), x))))),
    "sin": _unary(lambda g, x, y, t: mul(g, ast.Call("cos", (x,)))),
    "cos": _unary(lambda g, x, y, t: neg(mul(g, ast.Call("sin", (x,))))),
    "tan": _unary(lambda g, x, y, t: mul(g, ast.Binary("+", ONE, ast.Binary("*", y, y)))),
    "sinpi": _unary(lambda g, x, y, t: mul(g, mul(_pi(t), ast.Call("cospi", (x,))))),
    "cospi": _unary(lambda g, x, y, t: neg(mul(g, mul(_pi(t), ast.Call("sinpi", (x,)))))),
    "asin": _unary(lambda g, x, y, t: div(g, ast.Call("sqrt", (ast.Binary("-", ONE, _square(x)),)))),
    "acos": _unary(lambda g, x, y, t: neg(div(g, ast.Call("sqrt", (ast.Binary("-", ONE, _square(x)),))))),
    "atan": _unary(lambda g, x, y, t: div(g, ast.Binary("+", ONE, _square(x)))),
    "sinh": _unary(lambda g, x, y, t: mul(g, ast.Call("cosh", (x,)))),
    "cosh": _unary(lambda g, x, y, t: mul(g, ast.Call("sinh", (x,)))),
    "tanh": _unary(lambda g, x, y, t: mul(g, ast.Binary("-", ONE, ast.Binary("*", y, y)))),
    "asinh": _unary(lambda g, x, y, t: div(g, ast.Call("sqrt", (ast.Binary("+", _square(x), ONE),)))),
    "acosh": _unary(lambda g, x, y, t: div(g, ast.Call("sqrt", (ast.Binary("-", _square(x), ONE),)))),
    "atanh": _unary(lambda g, x, y, t: div(g, ast.Binary("-", ONE, _square(x)))),
    "erf": _unary(lambda g, x, y, t: mul(g, ast.Binary("*", div(_const(t, 2), ast.Call("sqrt", (_pi(t),))),
                                                         ast.Call("exp", (neg(_square(x)),))))),
    "erfc": _unary(lambda g, x, y, t: neg(mul(g, ast.Binary("*", div(_const(t, 2), ast.Call("sqrt", (_pi(t),))),
                                                              ast.Call("exp", (neg(_square(x)),)))))),
    "erfinv": _unary(lambda g, x, y, t: mul(g, ast.Binary("*", div(ast.Call("sqrt", (_pi(t),)), _const(t, 2)),
                                                            ast.Call("exp", (_square(y),))))),
    "erfcinv": _unary(lambda g, x, y, t: neg(mul(g, ast.Binary("*", div(ast.Call("sqrt", (_pi(t),)), _const(t, 2)),
                                                                 ast.Call("exp", (_square(y),)))))),
    "erfcx": _unary(lambda g, x, y, t: mul(g, ast.Binary("-", ast.Binary("*", ast.Binary("*", _const(t, 2), x), y),
                                                         div(_const(t, 2), ast.Call("sqrt", (_pi(t),)))))),
    "normcdf": _unary(lambda g, x, y, t: mul(g, div(ast.Call("exp", (neg(div(_square(x), _const(t, 2))),)),
                                                    ast.Call("sqrt", (ast.Binary("*", _const(t, 2), _pi(t)),))))),
    "normcdfinv": _unary(lambda g, x, y, t: mul(g, ast.Binary("*", ast.Call("sqrt", (ast.Binary("*", _const(t, 2), _pi(t)),)),
                                                              ast.Call("exp", (div(_square(y), _const(t, 2)),))))),
    "fabs": _unary(lambda g, x, y, t: mul(g, _sign(x))),
    "ceil": _unary(_zero), "floor": _unary(_zero), "round": _unary(_zero), "trunc": _unary(_zero),
    "logb": _unary(_zero),
    "max": _max_rule(">"),
    "min": _max_rule("<"),
    "fmax": _fmax_rule(">="),
    "fmin": _fmax_rule("<="),
    "pow": _pow_rule,
    "atan2": _atan2_rule,
    "hypot": _hypot_rule,
    "norm3d": _hypot_rule,
    "norm4d": _hypot_rule,
    "rhypot": _rhypot_rule,
    "rnorm3d": _rhypot_rule,
    "rnorm4d": _rhypot_rule,
    "fdivide": _division_rule,
    "fmod": _fmod_rule,
    "remainder": _remainder_rule,
    "copysign": _copysign_rule,
    "fdim": _fdim_rule,
    "fma": _fma_rule,
}


# ----------------------------------------------------------------------------- the walk


def partials(expr: ast.Expr, active: Callable[[ast.Access], bool],
             g: Optional[ast.Expr] = None) -> list[tuple[ast.Access, ast.Expr]]:
    """The cotangent each active tensor read of ``expr`` receives when ``expr`` receives ``g``
    (None: 1), as ``(access, expression)`` pairs in the order of the reads.

    ``active(access)`` says whether a float read may depend on a differentiated input. Raises
    :class:`NotDifferentiable` for an operation with no derivative on an active value.
    """
    found: list[tuple[ast.Access, ast.Expr]] = []
    _walk(expr, g, active, found)
    return found


def depends(expr: ast.Expr, active: Callable[[ast.Access], bool]) -> bool:
    """Whether the value of ``expr`` (not its indices) may depend on an active read."""
    if isinstance(expr, ast.Access):
        return active(expr)
    return any(depends(child, active) for child in _value_children(expr))


def _value_children(expr: ast.Expr) -> tuple:
    # a ternary's condition and a comparison's operands pass no derivative on
    if isinstance(expr, ast.Ternary):
        return (expr.then, expr.other)
    if isinstance(expr, ast.Binary) and expr.type is ScalarType.BOOL:
        return ()
    if isinstance(expr, ast.Unary) and expr.op == "!":
        return ()
    if isinstance(expr, ast.Access):
        return ()
    return expr.children()


def _walk(e: ast.Expr, g, active, found) -> None:
    if not depends(e, active):
        return
    if isinstance(e, ast.Access):
        found.append((e, ONE if g is None else g))
        return
    if e.type is not None and not e.type.is_float:
        return  # an integer value of an active float (a cast): no derivative flows, as in PyTorch
    if isinstance(e, ast.Cast):
        _walk(e.operand, g, active, found)
    elif isinstance(e, ast.Unary):
        _walk(e.operand, neg(ONE if g is None else g), active, found)
    elif isinstance(e, ast.Ternary):
        # the whole cotangent stays under the condition: a branch's reads may be out of
        # bounds where it is not taken (padding), and so may its derivative's
        for branch, taken in ((e.then, True), (e.other, False)):
            inner: list = []
            _walk(branch, g, active, inner)
            found.extend((access, ternary(e.cond, term, ZERO) if taken else ternary(e.cond, ZERO, term))
                         for access, term in inner)
    elif isinstance(e, ast.Binary):
        a, b = e.lhs, e.rhs
        if e.op == "+":
            pieces = (g, g)
        elif e.op == "-":
            pieces = (g, neg(ONE if g is None else g))
        elif e.op == "*":
            pieces = (mul(g, b), mul(g, a))
        elif e.op == "/":
            pieces = _division_rule(g, (a, b), e, e.type)
        else:
            raise NotDifferentiable(e, f"'{e.op}' has no derivative (in '{e}')")
        _walk(a, pieces[0], active, found)
        _walk(b, pieces[1], active, found)
    elif isinstance(e, ast.Call):
        rule = RULES.get(e.func)
        if rule is None:
            raise NotDifferentiable(e, f"builtin '{e.func}' has no derivative in tcpy (in '{e}')")
        for arg, piece in zip(e.args, rule(g, e.args, e, e.type)):
            if piece is not None:
                _walk(arg, piece, active, found)
    else:  # literals, index and size variables carry no tensor value
        return
