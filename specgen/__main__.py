"""``python -m specgen``: the ``specgen`` command, from whatever checkout is on the path."""

from specgen.cli import main

main(prog_name="specgen")
