"""The server process ``benchmarks.serving_attacks`` attacks: the daemon's OIP app and
bounded listener (``edge_sync.serve.listeners``, the default ``serve.limits``) over real ONNX
Runtime sessions of the example MLP and CNN and a BYTES identity graph.

``python -m benchmarks._attack_server MODELS_DIR PORT_FILE``: serves on a free port of
127.0.0.1, written to ``PORT_FILE`` once it listens; runs until SIGTERM.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from pathlib import Path

MODELS = ("mlp", "cnn", "id_bytes")


def identity_bytes(path: Path) -> None:
    """A BYTES [n, m] -> BYTES identity graph at ``path``."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "id_bytes",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["n", "m"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["n", "m"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def main(folder: Path, port_file: Path) -> None:
    """Serve the models in ``folder`` until stopped."""
    from edge_sync.config import ServeLimitsConfig
    from edge_sync.engine.base import LoadRequest
    from edge_sync.engine.host import InProcessHost
    from edge_sync.serve.app import create_app
    from edge_sync.serve.codec import ServeLimits
    from edge_sync.serve.listeners import ConnectionLimits, connection_cap, server

    host = InProcessHost()
    files = {"mlp": folder / "mlp/1.0.0.onnx", "cnn": folder / "cnn/1.0.0.onnx",
             "id_bytes": folder / "id_bytes.onnx"}  # fmt: skip
    for name, path in files.items():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        host.swap(name, host.build(LoadRequest(name, "1.0.0", path, digest)))
    config = ServeLimitsConfig()
    app = create_app(host, list(MODELS), dict, "bench", limits=ServeLimits.from_config(config))
    limits = ConnectionLimits(
        max_connections=connection_cap(config.max_connections),
        max_header_bytes=config.max_header,
        header_timeout_s=config.header_timeout,
        keepalive_timeout_s=config.keepalive_timeout,
        body_timeout_s=config.body_timeout,
    )
    srv = server(app, "127.0.0.1", 0, limits)

    def announce() -> None:  # once listening: the port, for the benchmark
        while not srv.started:
            time.sleep(0.01)
        port_file.write_text(str(srv.servers[0].sockets[0].getsockname()[1]))

    threading.Thread(target=announce, daemon=True).start()
    srv.run()  # as the daemon runs it (uvloop), until SIGTERM


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
