"""``python -m modelreg``."""

from modelreg.cli.main import main

main()
