import sys

from dtq_bench.suite import main

sys.exit(main())
