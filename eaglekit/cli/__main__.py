"""`python -m eaglekit.cli` runs the same entry point as the `eaglekit` console script."""

from eaglekit.cli.main import main

main()
