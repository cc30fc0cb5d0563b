import sys

from services.decode import main

sys.exit(main())
