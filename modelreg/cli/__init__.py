"""The ``modelreg`` command line: argument parsing only, calling library functions."""
