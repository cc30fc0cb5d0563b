import sys

from services.prefill import main

sys.exit(main())
