"""`python -m services.planner [flags]`."""

import sys

from services.planner.main import main

sys.exit(main())
