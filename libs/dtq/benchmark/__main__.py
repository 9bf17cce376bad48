import sys

from dtq.benchmark import main

sys.exit(main())
