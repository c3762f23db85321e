"""What runs a model: the ``Engine`` and ``EngineHost`` protocols, the ONNX Runtime engine
(``ort``), the in-process host with its leases and memory budget (``host``), weights
shared between versions (``weights``), TensorRT (``tensorrt``)."""
