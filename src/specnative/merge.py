"""`python -m specnative.merge`: the old spelling of `specnative merge`."""
import sys

from specnative.cli import merge_main

if __name__ == "__main__":
    sys.exit(merge_main())
