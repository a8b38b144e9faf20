"""`python -m turnkeeper` is the `turnkeeper` command."""

from turnkeeper.cli import main

main()
