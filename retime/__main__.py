"""``python -m retime`` runs the CLI."""

from retime.cli import main

main()
