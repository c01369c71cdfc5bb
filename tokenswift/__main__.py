"""`python -m tokenswift ...`: see cli.py."""

import sys

from tokenswift.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
