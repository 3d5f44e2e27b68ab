"""``python -m uqreg``: the ``uqreg`` command line (:func:`uqreg.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
