"""``python -m uqvision.cli`` (as ``python -m uqvision``)."""

import sys

from . import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
