"""``python -m tcpy ...``: the command line (see :mod:`tcpy.cli`)."""
import sys

from .cli import main

sys.exit(main())
