"""C text of expressions: loop-IR index expressions (:func:`index_c`), and TC's index and value
expressions at the point the emitter (:class:`tcpy.codegen.emit._Emitter`) is at, in the types
sema gave them with TC's semantics (C-like promotion, integer ``/`` and ``%`` truncating in
values and flooring in index expressions, division by zero and out-of-bounds data-dependent
indices reported through the return code, lazy ternaries, saturating casts); a size-generic
kernel's sizes and extents are C locals (:mod:`tcpy.generic`)."""
from tcpy.codegen.cwriter import c_literal
from tcpy.generic import size_c_name
from tcpy.lang import ast
from tcpy.lang.types import INDEX_VALUE_TYPE, ScalarType, promote
from tcpy.lang.visit import exact_index_value, is_index_value, is_static_index
from tcpy.loopir import BinOp, Call, Const, IExpr, Neg, Select, Var

# Builtins that csrc/tcpy_runtime.h defines (as tcpy_<name>f / tcpy_<name>); the others are libm's.
RUNTIME_BUILTINS = frozenset({
    "fmax", "fmin", "rsqrt", "rcbrt", "exp10", "fdivide", "rhypot", "norm3d", "norm4d", "rnorm3d", "rnorm4d",
    "sinpi", "cospi", "erfcx", "erfinv", "erfcinv", "normcdf", "normcdfinv",
    "cyl_bessel_i0", "cyl_bessel_i1",
})

_C_BINARY = {"+", "-", "*", "<=", "<", ">=", ">", "==", "&&", "||"}


def index_c(expr: IExpr, top: bool = False) -> str:
    """C text (int64 arithmetic) of a loop-IR index expression.

    ``top`` leaves the outermost operation unparenthesised: OpenMP wants ``c0 <= N`` as a
    loop condition, not ``(c0 <= N)``.
    """
    if isinstance(expr, Const):
        return str(expr.value)
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, BinOp):
        a, b = index_c(expr.lhs), index_c(expr.rhs)
        if expr.op in _C_BINARY:
            return f"{a} {expr.op} {b}" if top else f"({a} {expr.op} {b})"
        if expr.op == "floordiv":
            return f"tcpy_floordiv_int64({a}, {b})"
        return f"({a} {'/' if expr.op == 'div' else '%'} {b})"  # exact division, remainder
    if isinstance(expr, Neg):
        return f"(-{index_c(expr.operand)})"
    if isinstance(expr, Call):
        fn = "tcpy_min_int64" if expr.fn == "min" else "tcpy_max_int64"
        out = index_c(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}({out}, {index_c(a)})"
        return out
    if isinstance(expr, Select):
        return f"({index_c(expr.cond)} ? {index_c(expr.then)} : {index_c(expr.other)})"
    raise NotImplementedError(f"index expression {expr!r}")


def c_name(tensor):
    """C identifier of a tensor: prefixed so TC names never clash with C or runtime names, and
    names passes generate (``pack.0``, with a ".") never clash with the def's own."""
    if "." in tensor:
        return "x_" + tensor.replace(".", "_")
    return "t_" + tensor


def identity(op, stype):
    """C expression of the identity of reduction ``op`` in type ``stype``."""
    if op == "+":
        return f"(({stype.c_type})0)"
    if op == "*":
        return f"(({stype.c_type})1)"
    return f"TCPY_{op.upper()}_IDENTITY_{stype.numpy_name}"


def combine(op, a, b, stype):
    """C expression of ``a op b`` for a reduction operator, in type ``stype``."""
    if op in ("+", "*"):
        return f"(({stype.c_type})({a} {op} {b}))"
    return f"tcpy_{op}_{stype.numpy_name}({a}, {b})"


def convert(text, src, dst):
    """C expression converting ``text`` of type ``src`` to ``dst`` with TC's cast rules."""
    if src is dst:
        return text
    return f"tcpy_cast_{src.numpy_name}_to_{dst.numpy_name}({text})"


def nan_flagged(op, acc_type):
    """Float max/min register reductions keep a separate NaN flag: gcc vectorizes a plain
    comparison reduction plus an or-reduction, but not a NaN-propagating select."""
    return op in ("max", "min") and acc_type.is_float


def extent(em, tensor, dim):
    """C text (int64) of dimension ``dim`` of ``tensor``."""
    extent = em.shapes[tensor][dim]
    if isinstance(extent, int):
        return f"INT64_C({extent})"
    return index_c(extent) if isinstance(extent, (Const, Var)) else f"({index_c(extent, top=True)})"


def size(em, name):
    """C text (int64) of size variable ``name``."""
    if em.generic is not None:
        return size_c_name(name)
    return f"INT64_C({em.program.sizes[name]})"


def index_text(em, expr):
    """C text (int64) of an index expression; floor semantics for / and %."""
    if isinstance(expr, ast.IntLit):
        return f"INT64_C({int(expr.value)})"
    if isinstance(expr, ast.IndexVar):
        return f"({em.env[expr.name]})"
    if isinstance(expr, ast.SizeVar):
        return size(em, expr.name)
    if isinstance(expr, ast.DimRef):
        return extent(em, expr.tensor, expr.dim)
    if isinstance(expr, ast.Unary) and expr.op == "-":
        return f"(-{index_text(em, expr.operand)})"
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
        return f"({index_text(em, expr.lhs)} {expr.op} {index_text(em, expr.rhs)})"
    if isinstance(expr, ast.Binary) and expr.op in ("/", "%"):
        fn = "tcpy_floordiv_int64" if expr.op == "/" else "tcpy_floormod_int64"
        if isinstance(expr.rhs, ast.IntLit) and expr.rhs.value != 0:
            return f"{fn}({index_text(em, expr.lhs)}, {index_text(em, expr.rhs)})"
        divisor = index_text(em, expr.rhs)
        em.uses_divzero = em.stmt_index
        return (f"({divisor} == 0 ? (tcpy_divzero = 1, INT64_C(0)) : "
                f"{fn}({index_text(em, expr.lhs)}, {divisor}))")
    # Data-dependent or otherwise computed: evaluate as a value (still with floor / and %,
    # as everything inside an index), widen to int64.
    em.in_index += 1
    try:
        return f"((int64_t)({value(em, expr)}))"
    finally:
        em.in_index -= 1


def access(em, tensor, indices, read=False):
    """C lvalue of ``tensor(indices)``, bounds-checked where range inference cannot prove it
    (an rvalue for a ``read`` of a tensor without elements)."""
    shape = em.shapes[tensor]
    if not indices:
        return f"{c_name(tensor)}[0]"
    terms = []
    for dim, index in enumerate(indices):
        text = index_text(em, index)
        if em.ir.options.check_indices and not is_static_index(index):
            code = em.error_code(
                f"index out of bounds in {em.stmt_label(em.current_stmt)}: "
                f"dimension {dim} of {tensor} is {{0}}, expected 0 <= index < {{1}}")
            text = f"tcpy_checked_index({text}, {extent(em, tensor, dim)}, &tcpy_err, {code}, err)"
        terms.append((text, extent(em, tensor, dim)))
    flat = terms[0][0]
    for text, dim_extent in terms[1:]:
        flat = f"({flat}) * {dim_extent} + {text}"
    nothing = f"((void)({flat}), ({em.types[tensor].c_type})0)"  # evaluate the checks, read nothing
    if read and em.generic is not None and not all(is_static_index(i) for i in indices):
        empty = " || ".join(f"{dim_extent} == 0" for _, dim_extent in terms)
        return f"({empty} ? {nothing} : {c_name(tensor)}[{flat}])"
    if read and 0 in shape:  # no element to fall back to
        return nothing
    return f"{c_name(tensor)}[{flat}]"


def value(em, expr):
    """C text of a value expression, of C type ``expr.type``."""
    t = expr.type
    if t is not INDEX_VALUE_TYPE and is_index_value(expr):
        # exact in 64 bits; the launcher refused sizes for which the int32 result overflows
        return f"(({t.c_type}){value(em, exact_index_value(expr))})"
    if isinstance(expr, ast.IntLit):
        return c_literal(expr.value, t)
    if isinstance(expr, ast.FloatLit):
        return c_literal(expr.value, t)
    if isinstance(expr, ast.IndexVar):
        return f"(({t.c_type})({em.env[expr.name]}))"
    if isinstance(expr, ast.SizeVar):
        if em.generic is not None:
            return f"(({t.c_type}){size(em, expr.name)})"
        return c_literal(em.program.sizes[expr.name], t)
    if isinstance(expr, ast.DimRef):
        if em.generic is not None:
            return f"(({t.c_type}){extent(em, expr.tensor, expr.dim)})"
        return c_literal(em.shapes[expr.tensor][expr.dim], t)
    if isinstance(expr, ast.Access):
        if expr.tensor in em.registers:  # an epilogue reads the element it is at
            return em.registers[expr.tensor]
        return access(em, expr.tensor, expr.indices, read=True)
    if isinstance(expr, ast.Cast):
        operand = exact_index_value(expr.operand)  # int64(i * N) is exact
        return convert(value(em, operand), operand.type, expr.to)
    if isinstance(expr, ast.Unary):
        if expr.op == "!":
            return f"(!{value(em, expr.operand)})"
        return f"(({t.c_type})(-{typed(em, expr.operand, t)}))"
    if isinstance(expr, ast.Ternary):
        return (f"({value(em, expr.cond)} ? {typed(em, expr.then, t)} : "
                f"{typed(em, expr.other, t)})")
    if isinstance(expr, ast.Binary):
        return _binary(em, expr)
    if isinstance(expr, ast.Call):
        return _call(em, expr)
    raise NotImplementedError(f"cannot emit {type(expr).__name__}")


def typed(em, expr, t):
    """``expr`` converted to ``t`` the way C promotion does (no saturation)."""
    text = value(em, expr)
    return text if expr.type is t else f"(({t.c_type}){text})"


def _binary(em, expr):
    op = expr.op
    if op in ("&&", "||"):
        return f"({value(em, expr.lhs)} {op} {value(em, expr.rhs)})"
    if op in ("<", ">", "<=", ">=", "==", "!="):
        common = promote(expr.lhs.type, expr.rhs.type)
        return f"({typed(em, expr.lhs, common)} {op} {typed(em, expr.rhs, common)})"
    t = expr.type
    a, b = typed(em, expr.lhs, t), typed(em, expr.rhs, t)
    if op in ("/", "%") and not t.is_float:
        if _checkless_divisor(expr.rhs, t):  # C's own division then means what TC's does
            if em.in_index:  # TC: index arithmetic floors
                return f"tcpy_floor{'div' if op == '/' else 'mod'}_{t.numpy_name}({a}, {b})"
            return f"(({t.c_type})({a} {op} {b}))"
        em.uses_divzero = em.stmt_index
        if em.in_index:  # TC: index arithmetic floors
            fn = f"tcpy_floor{'div' if op == '/' else 'mod'}_{t.numpy_name}"
            text = f"{fn}({a}, {b})"
            if t.is_signed:  # MIN / -1 traps on x86: -1 needs no division anyway
                minus_one = f"({t.c_type})(-({a}))" if op == "/" else f"({t.c_type})0"
                text = f"({b} == -1 ? {minus_one} : {text})"
            return f"({b} == 0 ? (tcpy_divzero = 1, ({t.c_type})0) : {text})"
        return f"tcpy_{'div' if op == '/' else 'mod'}_{t.numpy_name}({a}, {b}, &tcpy_divzero)"
    if op == "%":
        return f"(({t.c_type})fmod{'f' if t is ScalarType.FLOAT32 else ''}({a}, {b}))"
    if op == "/" and em.reciprocals and size_divisor(expr):
        # the divisor is a power of two here (see _Emitter.nests): the same value, no division per element
        return f"(({t.c_type})({a} * (({t.c_type})1 / {b})))"
    return f"(({t.c_type})({a} {op} {b}))"


def _checkless_divisor(divisor, t) -> bool:
    """Whether integer division in type ``t`` by ``divisor`` needs no check per element: a
    literal that is positive in every integer type as wide as ``t`` (never 0, nor the -1 whose
    quotient of MIN overflows), so the C compiler also turns it into shifts and multiplies."""
    return isinstance(divisor, ast.IntLit) and 0 < int(divisor.value) < 2 ** (t.bits - 1)


#: The nodes of a divisor computed from the sizes alone, with no error to report.
_SIZE_NODES = (ast.SizeVar, ast.DimRef, ast.IntLit, ast.FloatLit, ast.Cast)


def size_divisor(expr) -> bool:
    """Whether ``expr`` is a float32 or float64 division by a value of the sizes alone, at least
    one of them (loop invariant in every loop; a generic kernel multiplies by its reciprocal where
    that is exact; a literal divisor is the compiler's to fold)."""
    if not (isinstance(expr, ast.Binary) and expr.op == "/"
            and expr.type in (ScalarType.FLOAT32, ScalarType.FLOAT64)):
        return False
    nodes = list(expr.rhs.walk())
    return any(isinstance(node, (ast.SizeVar, ast.DimRef)) for node in nodes) and all(isinstance(node, _SIZE_NODES) or (isinstance(node, ast.Binary) and node.op in ("+", "-", "*"))
               or (isinstance(node, ast.Unary) and node.op == "-") for node in nodes)


def _call(em, expr):
    t = expr.type
    args = [typed(em, a, t) for a in expr.args]
    if expr.func in ("min", "max"):
        return f"tcpy_{expr.func}_{t.numpy_name}({args[0]}, {args[1]})"
    if t is ScalarType.FLOAT64:
        suffix = ""
    else:  # builtins compute in float32 at least (TC: promote(float, args))
        suffix = "f"
        t = ScalarType.FLOAT32
    name = ("tcpy_" if expr.func in RUNTIME_BUILTINS else "") + expr.func + suffix
    return f"{name}({', '.join(args)})"
