"""`python -m specnative.schema`: the old spelling of `specnative schema` (the columns are defined in
specnative.record.schema)."""
import sys

from specnative.cli import schema_main

if __name__ == "__main__":
    sys.exit(schema_main())
