"""What runs a model: the ``Engine`` and ``EngineHost`` protocols with their value types
(``base``), the self-test a version passes before it serves (``selftest``), the ONNX
Runtime engine (``ort``), the in-process host with its leases and memory budget
(``host``), weights shared between versions (``weights``), TensorRT (``tensorrt``),
ONNX Runtime's log (``ortlog``) and the C heap kept small (``heap``)."""
