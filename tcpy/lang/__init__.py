"""The TC language layer: grammar, AST, semantic checks. Imports neither islpy nor numpy."""
from .ast import Program, Def
from .parser import parse_program
from .sema import check_program


def parse(source: str, filename: str = "<string>") -> Program:
    """Parse and check TC source; return the checked :class:`Program` (all its defs)."""
    return check_program(parse_program(source, filename), filename)


__all__ = ["parse", "parse_program", "check_program", "Program", "Def"]
