"""The edge daemon: follows a model repository, verifies what it receives, hot-swaps engines.

``config`` reads ``edge.yaml``; ``watcher`` follows the git branch, or the metadata
mirrored to the artifact remote with conditional requests (``_probe``), metadata only;
``trust`` verifies metadata and targets (python-tuf), fetched by ``_fetch`` (files, HTTP)
and ``_s3``; ``updater`` runs one sync (plan, fetch, apply, build, self-test, swap,
commit) over the ``state`` dir; ``engine`` is the hand-off to what serves (ONNX
Runtime in process); ``daemon`` is the loop, ``edge status`` and the systemd unit.
"""
