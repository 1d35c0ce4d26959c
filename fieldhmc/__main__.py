"""Entry point for ``python -m fieldhmc``; see :mod:`fieldhmc.cli`."""

import sys

from fieldhmc.cli import main

if __name__ == "__main__":
    sys.exit(main())
