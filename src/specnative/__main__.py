import sys

from specnative.cli import main

sys.exit(main())
