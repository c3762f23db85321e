"""Side-by-side performance suite of modelreg (``make bench``, ``python -m benchmarks``).

Each benchmark module exposes ``run(quick: bool) -> dict`` returning a JSON-ready
result with ``measurements`` (name -> timing), ``ratios`` (name -> number) and
``goals`` (each with a name, target, value and whether it passed); ``__main__`` runs
them, prints a table and writes the JSON report.
"""
