"""The edge daemon: follows a model repository, verifies what it receives, hot-swaps engines.

By role (docs/architecture.md draws the layers and what each may import):

- ``decide/``: pure decisions, table-tested, no I/O and no clock of their own: the health
  verdict, what a start does after an unclean stop, when to poll again;
- ``state/``: what a device holds: the state models and the state dir with its blobs;
- ``sync/``: one sync: the watcher and its metadata sources, trust (python-tuf), the
  transports (files, HTTP, S3), the updater, the report to the fleet;
- ``engine/``: what runs a model: the ONNX Runtime engine, the in-process host (leases,
  swaps, memory budget), weights shared between versions, TensorRT;
- ``serve/``: the Open Inference Protocol v2 server, its codec and bounds, metrics, and the
  request recorder the health gate reads;
- ``config`` (``edge.yaml``), ``clock`` (the device's time of day), ``errors`` (the
  exception tree) and ``daemon``, the one place that wires them together.
"""
