"""Compiler, OpenCL C tables: the expression of every elementwise function per dtype category,
reduction identities and combiners, loads, stores and casts. ``{a}``, ``{b}``, ``{c}`` are
operands (already in temporaries, so they may repeat), ``{T}`` is the result's math type and
``{R}`` the real type of a complex operand."""

from __future__ import annotations

# Categories are DType.kind: "f" float math (float/double), "i" signed int, "u" unsigned int,
# "b" bool (as int), "c" complex (float2/double2). A missing one: the function does not take it.
_F_UNARY = ["exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "asin",
            "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "ceil", "floor",
            "trunc"]

EW: dict[str, dict[str, str]] = {name: {"f": f"{name}({{a}})"} for name in _F_UNARY}
for _n in ("ceil", "floor", "trunc"):
    EW[_n].update({"i": "{a}", "u": "{a}", "b": "{a}"})
EW.update({
    # x + y -> x + y (complex: componentwise on float2/double2)
    "add": {"f": "({a} + {b})", "i": "({T})({a} + {b})", "u": "({T})({a} + {b})",
            "c": "({a} + {b})", "b": "({a} | {b})"},
    "subtract": {"f": "({a} - {b})", "i": "({T})({a} - {b})", "u": "({T})({a} - {b})",
                 "c": "({a} - {b})"},
    "multiply": {"f": "({a} * {b})", "i": "({T})({a} * {b})", "u": "({T})({a} * {b})",
                 "b": "({a} & {b})",
                 "c": "({T})({a}.x*{b}.x - {a}.y*{b}.y, {a}.x*{b}.y + {a}.y*{b}.x)"},
    "divide": {"f": "({a} / {b})", "c": "cdiv_{R}({a}, {b})"},
    "negative": {"f": "(-{a})", "i": "({T})(-{a})", "u": "({T})(-{a})", "c": "(-{a})"},
    "positive": {"f": "{a}", "i": "{a}", "u": "{a}", "c": "{a}"},
    "abs": {"f": "fabs({a})", "i": "({T})abs({a})", "u": "{a}", "b": "{a}",
            "c": "hypot({a}.x, {a}.y)"},
    "square": {"f": "({a} * {a})", "i": "({T})({a} * {a})", "u": "({T})({a} * {a})",
               "c": "({T})({a}.x*{a}.x - {a}.y*{a}.y, 2*{a}.x*{a}.y)"},
    "reciprocal": {"f": "(({T})1 / {a})", "c": "cdiv_{R}(({T})(1, 0), {a})"},
    "round": {"f": "rint({a})", "i": "{a}", "u": "{a}", "b": "{a}",
              "c": "({T})(rint({a}.x), rint({a}.y))"},
    "sign": {"f": "(isnan({a}) ? {a} : {a} > 0 ? ({T})1 : {a} < 0 ? ({T})-1 : ({T})0)",
             "i": "({T})(({a} > 0) - ({a} < 0))", "u": "({T})({a} > 0)",
             "c": "csign_{R}({a})"},
    "signbit": {"f": "(signbit({a}) != 0)"},
    "isnan": {"f": "(isnan({a}) != 0)", "i": "0", "u": "0", "b": "0",
              "c": "(isnan({a}.x) || isnan({a}.y))"},
    "isinf": {"f": "(isinf({a}) != 0)", "i": "0", "u": "0", "b": "0",
              "c": "(isinf({a}.x) || isinf({a}.y))"},
    "isfinite": {"f": "(isfinite({a}) != 0)", "i": "1", "u": "1", "b": "1",
                 "c": "(isfinite({a}.x) && isfinite({a}.y))"},
    "atan2": {"f": "atan2({a}, {b})"},
    "hypot": {"f": "hypot({a}, {b})"},
    "copysign": {"f": "copysign({a}, {b})"},
    "nextafter": {"f": "nextafter({a}, {b})"},
    "pow": {"f": "pow({a}, {b})", "i": "ipow_{T}({a}, {b})", "u": "ipow_{T}({a}, {b})",
            "c": "cpow_{R}({a}, {b})"},
    # maximum/minimum propagate NaN (fmax would drop it)
    "maximum": {"f": "((isnan({a}) || {a} > {b}) ? {a} : {b})", "i": "max({a}, {b})",
                "u": "max({a}, {b})", "b": "({a} | {b})"},
    "minimum": {"f": "((isnan({a}) || {a} < {b}) ? {a} : {b})", "i": "min({a}, {b})",
                "u": "min({a}, {b})", "b": "({a} & {b})"},
    "logaddexp": {"f": "(isnan({a}) || isnan({b}) ? {a} + {b} : {a} == {b} ? {a} + "
                       "log(({T})2) : fmax({a}, {b}) + log1p(exp(-fabs({a} - {b}))))"},
    # floor division and remainder with Python's signs; integer x // 0 gives 0, not a trap.
    # NOTE: MIN / -1 and MIN % -1 are undefined in OpenCL C (x86 idiv traps or returns junk:
    # MIN % -1 gave -1): a divisor of -1 is its own case, MIN // -1 wrapping to MIN as numpy's
    "floor_divide": {"f": "ffloordiv_{T}({a}, {b})",
                     "i": "({b} == 0 ? ({T})0 : {b} == -1 ? ({T})({a} == {MIN} ? {a} : -{a}) : "
                          "({T})({a} / {b} - (({a} % {b} != 0) && (({a} < 0) != ({b} < 0)))))",
                     "u": "({b} == 0 ? ({T})0 : ({T})({a} / {b}))"},
    # x % -1 -> 0 (and x % 0 -> 0)
    "remainder": {"f": "fremainder_{T}({a}, {b})",
                  "i": "(({b} == 0 || {b} == -1) ? ({T})0 : ({T})((({a} % {b}) != 0 && "
                       "((({a} % {b}) < 0) != ({b} < 0))) ? ({a} % {b}) + {b} : ({a} % {b})))",
                  "u": "({b} == 0 ? ({T})0 : ({T})({a} % {b}))"},
    "equal": {"f": "({a} == {b})", "i": "({a} == {b})", "u": "({a} == {b})",
              "b": "({a} == {b})", "c": "({a}.x == {b}.x && {a}.y == {b}.y)"},
    "not_equal": {"f": "({a} != {b})", "i": "({a} != {b})", "u": "({a} != {b})",
                  "b": "({a} != {b})", "c": "({a}.x != {b}.x || {a}.y != {b}.y)"},
    "less": {"f": "({a} < {b})", "i": "({a} < {b})", "u": "({a} < {b})"},
    "less_equal": {"f": "({a} <= {b})", "i": "({a} <= {b})", "u": "({a} <= {b})"},
    "greater": {"f": "({a} > {b})", "i": "({a} > {b})", "u": "({a} > {b})"},
    "greater_equal": {"f": "({a} >= {b})", "i": "({a} >= {b})", "u": "({a} >= {b})"},
    "logical_and": {"b": "({a} && {b})"},
    "logical_or": {"b": "({a} || {b})"},
    "logical_xor": {"b": "({a} != {b})"},
    "logical_not": {"b": "(!{a})"},
    "bitwise_and": {"i": "({T})({a} & {b})", "u": "({T})({a} & {b})", "b": "({a} & {b})"},
    "bitwise_or": {"i": "({T})({a} | {b})", "u": "({T})({a} | {b})", "b": "({a} | {b})"},
    "bitwise_xor": {"i": "({T})({a} ^ {b})", "u": "({T})({a} ^ {b})", "b": "({a} ^ {b})"},
    "bitwise_invert": {"i": "({T})(~{a})", "u": "({T})(~{a})", "b": "(!{a})"},
    # shifts by >= the bit width: 0 (or -1 for negative right shifts), as numpy gives
    "bitwise_left_shift": {"i": "({b} >= {BITS} ? ({T})0 : ({T})({a} << {b}))",
                           "u": "({b} >= {BITS} ? ({T})0 : ({T})({a} << {b}))"},
    "bitwise_right_shift": {"i": "({b} >= {BITS} ? ({T})({a} < 0 ? -1 : 0) : ({T})({a} >> {b}))",
                            "u": "({b} >= {BITS} ? ({T})0 : ({T})({a} >> {b}))"},
    "where": {"f": "({c} ? {a} : {b})", "i": "({c} ? {a} : {b})", "u": "({c} ? {a} : {b})",
              "b": "({c} ? {a} : {b})", "c": "({c} ? {a} : {b})"},
    "conj": {"c": "({T})({a}.x, -{a}.y)", "f": "{a}", "i": "{a}", "u": "{a}", "b": "{a}"},
    "real": {"c": "{a}.x", "f": "{a}"},
    "imag": {"c": "{a}.y", "f": "(({T})0)"},
    "sqrt_c": {"c": "csqrt_{R}({a})"},
    "exp_c": {"c": "cexp_{R}({a})"},
    "log_c": {"c": "clog_{R}({a})"},
    "complex": {"f": "({T})({a}, {b})"},
    "identity": {"f": "{a}", "i": "{a}", "u": "{a}", "b": "{a}", "c": "{a}"},
})

# Functions whose complex form has its own helper (the dispatcher picks "<name>_c").
COMPLEX_SPECIAL = {"sqrt": "sqrt_c", "exp": "exp_c", "log": "log_c"}

# Which operand of "where" is the condition: the table puts it as {c}, the node as srcs[0].
REDUCE_IDENTITY = {
    "sum": {"f": "0", "i": "0", "u": "0", "b": "0", "c": "({T})(0, 0)"},
    "prod": {"f": "1", "i": "1", "u": "1", "b": "1", "c": "({T})(1, 0)"},
    "max": {"f": "-INFINITY", "i": "{MIN}", "u": "0", "b": "0"},
    "min": {"f": "INFINITY", "i": "{MAX}", "u": "{MAX}", "b": "1"},
    "any": {"b": "0"},
    "all": {"b": "1"},
}
REDUCE_COMBINE = {
    "sum": {"f": "({a} + {b})", "i": "({a} + {b})", "u": "({a} + {b})", "b": "({a} + {b})",
            "c": "({a} + {b})"},
    "prod": {"f": "({a} * {b})", "i": "({a} * {b})", "u": "({a} * {b})", "b": "({a} * {b})",
             "c": "({T})({a}.x*{b}.x - {a}.y*{b}.y, {a}.x*{b}.y + {a}.y*{b}.x)"},
    "max": {"f": "((isnan({a}) | ({a} > {b})) ? {a} : {b})", "i": "max({a}, {b})",
            "u": "max({a}, {b})", "b": "({a} | {b})"},
    "min": {"f": "((isnan({a}) | ({a} < {b})) ? {a} : {b})", "i": "min({a}, {b})",
            "u": "min({a}, {b})", "b": "({a} & {b})"},
    "any": {"b": "({a} || {b})"},
    "all": {"b": "({a} && {b})"},
}

# max and min of float values on a CPU's serial row vectors (``render._vector_accumulate``):
# the combine that keeps the extreme of two vectors, NaN left to a mask kept beside them
# (``isnan`` of each vector read, or-ed), which makes the result NaN at the end.
VECTOR_EXTREME = {"max": "(({a} > {b}) ? {a} : {b})", "min": "(({a} < {b}) ? {a} : {b})"}

# Arg reductions of float values (the index of the first maximum or minimum, NaN counting as
# either; ``render._arg_row``, ``render._strip_rows``): the accumulator's identity, the
# comparison that takes a later element, and on vectors the one that keeps the best so far
# (component-wise, -1 for true; false where either is NaN, so that a later element replaces
# where ``~keep & ~isnan(best)``: greater, or NaN where the best is not).
ARG_REDUCE = {
    "argmax": {"ident": "-INFINITY", "cmp": "({b} > {a})", "vkeep": "islessequal({b}, {a})"},
    "argmin": {"ident": "INFINITY", "cmp": "({b} < {a})", "vkeep": "isgreaterequal({b}, {a})"},
}

INT_LIMITS = {
    "char": ("CHAR_MIN", "CHAR_MAX"), "short": ("SHRT_MIN", "SHRT_MAX"),
    "int": ("INT_MIN", "INT_MAX"), "long": ("LONG_MIN", "LONG_MAX"),
    "uchar": ("0", "UCHAR_MAX"), "ushort": ("0", "USHRT_MAX"), "uint": ("0", "UINT_MAX"),
    "ulong": ("0", "ULONG_MAX"),
}


# -- complex forms of the transcendental functions (z = x + iy in {a}; {T} complex, {R} real) --
# The prelude's helpers give C99 Annex G special values (infinite, NaN and signed-zero parts);
# the trigonometric functions are their hyperbolic twins at iz, as the standard defines them.
_IZ = "({T})(-{a}.y, {a}.x)"  # i*z


def _mul_i_neg(expr: str) -> str:
    """-i * w for a complex expression w: (w.y, -w.x)."""
    return f"({{T}})(({expr}).y, -({expr}).x)"


_C_FORMS = {
    "sinh": "csinh_{R}({a})",
    "cosh": "ccosh_{R}({a})",
    "tanh": "ctanh_{R}({a})",
    "asinh": "casinh_{R}({a})",
    "acosh": "cacosh_{R}({a})",
    "atanh": "catanh_{R}({a})",
    "acos": "cacos_{R}({a})",
    # sin z = -i sinh(iz), cos z = cosh(iz), tan z = -i tanh(iz), asin z = -i asinh(iz), ...
    "sin": _mul_i_neg(f"csinh_{{R}}({_IZ})"),
    "cos": f"ccosh_{{R}}({_IZ})",
    "tan": _mul_i_neg(f"ctanh_{{R}}({_IZ})"),
    "asin": _mul_i_neg(f"casinh_{{R}}({_IZ})"),
    "atan": _mul_i_neg(f"catanh_{{R}}({_IZ})"),
    "expm1": "cexpm1_{R}({a})",
    "log1p": "clog1p_{R}({a})",
    "log2": "(clog_{R}({a}) / log(({R})2))",
    "log10": "(clog_{R}({a}) / log(({R})10))",
}
for _n, _e in _C_FORMS.items():
    EW[_n]["c"] = _e
