"""``python -m uqvision`` (and ``torchrun -m uqvision predict ...``)."""

import sys

from .cli import main

sys.exit(main())
