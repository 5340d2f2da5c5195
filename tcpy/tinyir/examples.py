"""The three naive programs of the Tiny IR spec (seed ``004_*``, section 5), as dicts.

``gemm(dtype)``, ``conv(dtype)`` (load it with ``sizes=CONV_SIZES``) and ``attention(dtype)``
build each program for element type ``dtype`` (``"fp16"`` as listed, or ``"fp32"``).

They are the spec's listings (comments dropped: they are not JSON) with two repairs. The
convolution listing adds the fp16 bias to the fp32 sums, an implicit cast its type rule forbids
(DtypeMismatch): ``conv`` casts the bias first. The attention listing subtracts the row maximum
``[B,H,M]`` from the scores ``[B,H,M,N]``, which the spec's own right-aligned broadcasting rule
rejects (BroadcastMismatch), and reshapes ``K^T`` ``[B,H,D,N]`` to ``[B,H,1,N,D]``, which by
RESHAPE's row-major meaning mixes D and N (a transpose is not a reshape): ``attention``
reshapes the row statistics to ``[B,H,M,1]`` and K itself to ``[B,H,1,N,D]``.
``attention_as_listed`` keeps the listing.
"""


def _u(id_, uop, src=(), **arg):
    node = {"id": id_, "uop": uop, "arg": arg}
    if src:
        node["src"] = list(src)
    return node


def gemm(dtype="fp16"):
    """C[M,N] = A[M,K] x B[K,N]: RESHAPE and EXPAND both to [M,N,K], MUL, REDUCE(SUM) over K."""
    return {"uops": [
        _u("n0", "INPUT", tensor_id="A", dtype=dtype, shape=["M", "K"]),
        _u("n1", "INPUT", tensor_id="B", dtype=dtype, shape=["K", "N"]),
        _u("n2", "RESHAPE", ["n0"], result_shape=["M", 1, "K"]),
        _u("n3", "PERMUTE", ["n1"], perm=[1, 0]),
        _u("n4", "RESHAPE", ["n3"], result_shape=[1, "N", "K"]),
        _u("n5", "EXPAND", ["n2"], result_shape=["M", "N", "K"], broadcast_dimensions=[0, 2]),
        _u("n6", "EXPAND", ["n4"], result_shape=["M", "N", "K"], broadcast_dimensions=[1, 2]),
        _u("n7", "MUL", ["n5", "n6"]),
        _u("n8", "REDUCE", ["n7"], op="SUM", axes=["K"], dtype="fp32"),
        _u("n9", "CAST", ["n8"], to=dtype),
    ]}


# the symbols the convolution listing leaves to the caller: one group, stride 2, pad 1
CONV_SIZES = {"G": 1, "pt": 1, "pb": 1, "pl": 1, "pr": 1, "Sh": 2, "Sw": 2, "Dh": 1, "Dw": 1}


def conv(dtype="fp16"):
    """A 3x3 convolution (stride 2, pad 1 with CONV_SIZES): PAD, POOL into windows, RESHAPE,
    EXPAND and PERMUTE input and weights to one shape, MUL, REDUCE(SUM), add the bias."""
    return {"uops": [
        _u("x", "INPUT", tensor_id="X", dtype=dtype, shape=["N", "Cin_total", "H", "W"]),
        _u("w", "INPUT", tensor_id="W", dtype=dtype, shape=["Cout", "Cin", "Kh", "Kw"]),
        _u("b", "INPUT", tensor_id="bias", dtype=dtype, shape=["Cout"]),
        _u("xp", "PAD", ["x"], pad=[[0, 0], [0, 0], ["pt", "pb"], ["pl", "pr"]], value=0),
        _u("xw", "POOL", ["xp"], kernel=["Kh", "Kw"], stride=["Sh", "Sw"], dilation=["Dh", "Dw"]),
        _u("x1", "RESHAPE", ["xw"], result_shape=["N", "G", "Cin", 1, "Oy", "Ox", "Kh", "Kw"]),
        _u("x2", "EXPAND", ["x1"], result_shape=["N", "G", "Cin", "Rcout", "Oy", "Ox", "Kh", "Kw"]),
        _u("x3", "PERMUTE", ["x2"], perm=[0, 1, 3, 4, 5, 2, 6, 7]),
        _u("w1", "RESHAPE", ["w"], result_shape=["G", "Rcout", "Cin", "Kh", "Kw"]),
        _u("w2", "RESHAPE", ["w1"], result_shape=[1, "G", "Rcout", 1, 1, "Cin", "Kh", "Kw"]),
        _u("w3", "EXPAND", ["w2"], result_shape=["N", "G", "Rcout", "Oy", "Ox", "Cin", "Kh", "Kw"]),
        _u("p", "MUL", ["x3", "w3"]),
        _u("yacc", "REDUCE", ["p"], op="SUM", axes=["Cin", "Kh", "Kw"], dtype="fp32"),
        _u("y0", "RESHAPE", ["yacc"], result_shape=["N", "Cout", "Oy", "Ox"]),
        _u("b1", "RESHAPE", ["b"], result_shape=[1, "Cout", 1, 1]),
        _u("b2", "CAST", ["b1"], to="fp32"),  # the listing adds fp16 to fp32 without it
        _u("y1", "ADD", ["y0", "b2"]),
        _u("y", "CAST", ["y1"], to=dtype),
    ]}


def _attention(dtype, as_listed):
    """Scores Q K^T as MUL + REDUCE(SUM) over D, then the row softmax with EXP2."""
    uops = [
        _u("n0", "INPUT", tensor_id="Q", dtype=dtype, shape=["B", "H", "M", "D"]),
        _u("n1", "INPUT", tensor_id="K", dtype=dtype, shape=["B", "H", "N", "D"]),
        _u("n2", "PERMUTE", ["n1"], perm=[0, 1, 3, 2]),
        _u("n3", "RESHAPE", ["n0"], result_shape=["B", "H", "M", 1, "D"]),
        _u("n4", "RESHAPE", ["n2" if as_listed else "n1"], result_shape=["B", "H", 1, "N", "D"]),
        _u("n5", "EXPAND", ["n3"], result_shape=["B", "H", "M", "N", "D"], broadcast_dimensions=[0, 1, 2, 4]),
        _u("n6", "EXPAND", ["n4"], result_shape=["B", "H", "M", "N", "D"], broadcast_dimensions=[0, 1, 3, 4]),
        _u("n7", "MUL", ["n5", "n6"]),
        _u("n8", "REDUCE", ["n7"], op="SUM", axes=["D"], dtype="fp32"),
        _u("n9", "REDUCE", ["n8"], op="MAX", axes=["N"], dtype="fp32"),
        _u("n10", "SUB", ["n8", "n9" if as_listed else "n9r"]),
        _u("n11", "MUL", ["n10", 1.442695]),
        _u("n12", "EXP2", ["n11"]),
        _u("n13", "REDUCE", ["n12"], op="SUM", axes=["N"], dtype="fp32"),
        _u("n14", "FDIV", ["n12", "n13" if as_listed else "n13r"]),
        _u("n15", "CAST", ["n14"], to=dtype),
    ]
    if not as_listed:
        del uops[2]
        uops.insert(9, _u("n9r", "RESHAPE", ["n9"], result_shape=["B", "H", "M", 1]))
        uops.insert(14, _u("n13r", "RESHAPE", ["n13"], result_shape=["B", "H", "M", 1]))
    return {"uops": uops}


def attention(dtype="fp16"):
    """Attention up to the softmax, repaired as the module docstring says."""
    return _attention(dtype, as_listed=False)


def attention_as_listed(dtype="fp16"):
    """The attention listing as the spec prints it (raises BroadcastMismatch at n10)."""
    return _attention(dtype, as_listed=True)
