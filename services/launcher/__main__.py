"""`python -m services.launcher [flags]` is `pdserve up [flags]`."""

import sys

from services.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["up", *sys.argv[1:]]))
