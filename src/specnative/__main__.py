from specnative.sweep import main
import sys

sys.exit(main())
