"""`python -m toolkit.cli <command> ...` (e.g. under `accelerate launch -m toolkit.cli sft ...`)."""

from toolkit.cli import main

main()
