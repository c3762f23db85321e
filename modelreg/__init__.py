"""modelreg: GitOps model registry for edge fleets.

The application package: the command line (``modelreg.cli``) and the example models.
The domain lives in the top-level packages ``registry``, ``signing``, ``pipelines`` and
``edge_sync``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("modelreg")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = ["__version__"]
