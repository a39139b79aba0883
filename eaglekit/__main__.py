"""`python -m eaglekit` (and `torchrun -m eaglekit finetune ...`) runs the CLI."""

from eaglekit.cli.main import main

main()
