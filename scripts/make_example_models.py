#!/usr/bin/env python3
"""Write the deterministic example ONNX models (and golden I/O) to a directory.

Usage::

    python scripts/make_example_models.py --out DIR [--size small|large] [--models mlp,cnn]
    python scripts/make_example_models.py --out DIR --large-external GIB

The second form writes ``DIR/mlp-large/<version>/model.onnx`` and ``model.onnx.data``
(ONNX external data, how every model over 2 GB is stored) for 1.0.0 and its fine-tune
1.1.0, each with at least GIB GiB of weights, streaming (one layer in memory at a time).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from modelreg.examples import (
    EXAMPLE_SIZES,
    EXAMPLE_VERSIONS,
    write_examples,
    write_large_external,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--size", choices=("small", "large"), default="small")
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated subset of {','.join(EXAMPLE_VERSIONS)} "
        "(default: every model available in --size)",
    )
    parser.add_argument(
        "--no-goldens", action="store_true", help="skip golden inputs/outputs (.npz)"
    )
    parser.add_argument(
        "--large-external",
        type=float,
        metavar="GIB",
        help="write only the large mlp (1.0.0, 1.1.0) with external data of GIB GiB each",
    )
    return parser


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, write the examples and list every file written.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit status: 0 on success, 2 on a usage error.
    """
    parser = _parser()
    args = parser.parse_args(argv)  # exits with status 2 on a usage error
    if args.large_external is not None:
        if args.large_external <= 0:
            parser.error("--large-external needs a positive size in GiB")
        for version in ("1.0.0", "1.1.0"):
            pair = write_large_external(
                args.out / "mlp-large" / version, version, args.large_external
            )
            for written_file in pair:
                print(f"{written_file}\t{written_file.stat().st_size}")
        return 0
    models = None
    if args.models is not None:
        models = [name.strip() for name in str(args.models).split(",") if name.strip()]
        bad = [name for name in models if args.size not in EXAMPLE_SIZES.get(name, ())]
        if not models or bad:
            valid = [name for name, sizes in EXAMPLE_SIZES.items() if args.size in sizes]
            parser.error(f"--models for --size {args.size} must be a subset of {valid}")
    written = write_examples(args.out, size=args.size, models=models, goldens=not args.no_goldens)
    for example in written:
        for path in (example.path, example.golden_inputs, example.golden_outputs):
            if path is not None:
                print(f"{path}\t{path.stat().st_size}\t{_sha256(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
