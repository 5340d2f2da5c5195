"""Epilogues: element-wise statements applied where the contraction engine stores its result.

A contraction is often followed by statements that consume its output one element at a time
(bias, scale, activation, cast)::

    C(m, n) +=! A(m, k) * B(k, n)
    Y(m, n) = max(C(m, n) + bias(n), 0)

Run as their own nest, they read all of ``C`` back from memory. Attached to the contraction as
its *epilogue*, they run in the micro-kernel's store of the last K block, on the tile that is
still in L1, and that second pass is gone.

Legality, for each statement following the contraction (or a statement already attached):

* it is an assignment (``=``, or a reduction operator with no reduction variable), its
  variables are exactly its left-hand ones, each over the same range as the contraction's
  output variable it stands for;
* it reads the contraction's output, and every statement of the chain it reads, only at the
  element it writes (``C(i, j)`` in ``Y(i, j) = ...``): reads elsewhere would see elements the
  engine has not finished;
* its target is not read by the contraction, and by earlier statements of the chain only at
  that same element;
* every index is affine in the index variables and every division is of floats, so the
  statement can raise no run-time error inside the engine's store.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang import ast
from ..lang.visit import is_static_index
from ..loopir import Epilogue, Program, Statement
from ..options import Options

__all__ = ["attach_epilogues"]


def attach_epilogues(program: Program, options: Options) -> Program:
    """``program`` with the element-wise consumers of each engine contraction attached to it."""
    if not options.fuse or program.generic is not None:
        return program  # (an epilogue's C indexes with the ranges planned)
    epilogues = []
    statements = program.statements
    index = 0
    while index < len(statements):
        producer = statements[index]
        chain: list[tuple[int, tuple[tuple[str, str], ...]]] = []
        if (producer.origin >= 0 and producer.panel is None
                and producer.engine is not None):
            written = {producer.stmt.target: tuple(e.name for e in producer.stmt.lhs)}
            while index + 1 + len(chain) < len(statements):
                candidate = index + 1 + len(chain)
                var_map = _consumer_map(producer, [statements[i] for i, _ in chain], written,
                                        statements[candidate])
                if var_map is None:
                    break
                chain.append((candidate, var_map))
                consumer = statements[candidate].stmt
                written[consumer.target] = tuple(dict(var_map)[e.name] for e in consumer.lhs)
        if chain:
            epilogues.append(Epilogue(index, tuple(chain)))
        index += 1 + len(chain)
    if not epilogues:
        return program
    return dataclasses.replace(program, epilogues=tuple(epilogues))


def _consumer_map(producer: Statement, chain: list[Statement], written: dict[str, tuple[str, ...]],
                  consumer: Statement) -> Optional[tuple[tuple[str, str], ...]]:
    """``((consumer var, producer var), ...)`` when ``consumer`` may join the epilogue, else None.

    ``written`` gives, for the contraction's output and each target of the chain so far, the
    element it is written at, in the producer's variables."""
    stmt = consumer.stmt
    if consumer.origin < 0 or consumer.panel is not None or stmt.reduction_vars or not stmt.lhs:
        return None
    if stmt.reduction is not None and not stmt.init:
        return None  # an in-place update (`+=` without `!`)
    if any(not isinstance(e, ast.IndexVar) for e in stmt.lhs) or len(set(stmt.output_vars)) != len(stmt.lhs):
        return None
    if any(isinstance(w, ast.Exists) for w in stmt.where) or not _error_free(stmt.rhs):
        return None
    reads = [a for a in stmt.rhs.walk() if isinstance(a, ast.Access)]
    # the consumer's variables, from the elements of the chain's tensors it reads
    var_map: dict[str, str] = {}
    for access in reads:
        point = written.get(access.tensor)
        if point is None:
            continue
        if any(not isinstance(e, ast.IndexVar) for e in access.indices):
            return None
        for e, var in zip(access.indices, point):
            if var_map.setdefault(e.name, var) != var:
                return None  # the same variable at two elements: not element-wise
    c_vars = written[producer.stmt.target]
    if sorted(var_map) != sorted(stmt.output_vars) or sorted(var_map.values()) != sorted(c_vars):
        return None
    if any(consumer.ranges[v] != producer.ranges[var_map[v]] for v in stmt.output_vars):
        return None
    for access in reads:  # every read of the chain's tensors is at the element written
        point = written.get(access.tensor)
        if point is not None and tuple(var_map[e.name] for e in access.indices) != point:
            return None
    own = tuple(var_map[e.name] for e in stmt.lhs)
    if stmt.target in written and written[stmt.target] != own:
        return None
    if stmt.target not in written and any(a.tensor == stmt.target for a in reads):
        return None  # reads its own earlier value somewhere the chain does not hold
    if _reads(producer.stmt, stmt.target):
        return None  # the contraction still reads what this statement would overwrite
    for earlier in chain:  # earlier statements may read the target only at the element written
        earlier_map = dict(_map_of(earlier, written))
        for access in (a for a in earlier.stmt.rhs.walk() if isinstance(a, ast.Access)):
            if access.tensor == stmt.target and access.tensor not in written:
                if any(not isinstance(e, ast.IndexVar) for e in access.indices):
                    return None
                if tuple(earlier_map.get(e.name) for e in access.indices) != own:
                    return None
    return tuple((v, var_map[v]) for v in stmt.output_vars)


def _map_of(statement: Statement, written) -> tuple[tuple[str, str], ...]:
    """An attached statement's variables in the producer's variables (from its left side)."""
    point = written[statement.stmt.target]
    return tuple((e.name, var) for e, var in zip(statement.stmt.lhs, point))


def _reads(stmt: ast.Stmt, tensor: str) -> bool:
    nodes = [stmt.rhs] + [w.expr for w in stmt.where if isinstance(w, ast.Exists)]
    return any(isinstance(n, ast.Access) and n.tensor == tensor for e in nodes for n in e.walk())


def _error_free(expr: ast.Expr) -> bool:
    """No run-time error is possible: static indices only (no bounds checks), no integer division."""
    for node in expr.walk():
        if isinstance(node, ast.Access) and not all(is_static_index(i) for i in node.indices):
            return False
        if isinstance(node, ast.Binary) and node.op in ("/", "%") and not node.type.is_float:
            return False
    return True
