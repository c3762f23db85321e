"""modelreg: GitOps model registry for edge fleets.

The application package: the command line (``modelreg.cli``) and the example models.
The domain lives in the top-level packages ``registry``, ``signing``, ``pipelines`` and
``edge_sync``.
"""

from registry.about import modelreg_version

__version__ = modelreg_version()

__all__ = ["__version__"]
