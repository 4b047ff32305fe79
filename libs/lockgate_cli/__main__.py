"""`python -m lockgate_cli ...`: the `lockgate` command without its console script."""

from lockgate_cli.root import run

run()
