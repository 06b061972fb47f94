"""`python -m ggpo_batch.cli` is the `ggpo-batch` command."""

from . import main

main()
