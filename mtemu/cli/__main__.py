"""`python -m mtemu.cli`."""
import sys

from . import main

sys.exit(main())
