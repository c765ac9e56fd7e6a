import sys

from specnative.cli import sweep_main

sys.exit(sweep_main())
