"""`python -m dtq.cli`: the `dtq` command."""

from dtq.cli import main

main()
