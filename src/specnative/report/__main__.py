import sys

from specnative.cli import report_main

sys.exit(report_main())
