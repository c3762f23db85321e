"""Open Inference Protocol v2 over gRPC on the device (``serve.grpc_listen``): the KServe
``GRPCInferenceService`` as Triton and MLServer serve it, so ``tritonclient.grpc`` and
any client generated from the protocol's ``.proto`` talk to it (docs/reference/daemon.md).

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer (typed
``contents`` or ``raw_input_contents``; answers in ``raw_output_contents``, as Triton
answers) and RepositoryIndex.  A request is served by the same core as REST
(``edge_sync.serve.core``): the same leases (an answer names the version that computed
it, in ``model_version``, and a swap never breaks a request in flight), the same budget
of decoded bytes in flight, the same judgement of a failed run and the same health
recording; every request is read by REST's own checks (``edge_sync.serve.codec``).

Bounds: messages over ``serve.limits.max_body`` are refused by gRPC itself
(RESOURCE_EXHAUSTED), as are calls over ``max_concurrent`` running plus ``max_queued``
waiting; a call whose deadline has passed is not run (DEADLINE_EXCEEDED); connections
are capped (``serve.limits.max_connections``, as REST's), one that has not finished its
handshake within ``header_timeout`` is closed, as is one idle for 5 minutes, and each
connection's streams are capped.  Refusals carry the
gRPC status of the HTTP status REST answers (:data:`STATUS`), and the version in the
``x-model-version`` trailer when one was involved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any, Final

import grpc

from edge_sync.engine.base import NUMPY_DTYPES
from edge_sync.errors import RefusedError
from edge_sync.serve.answer import BYTES_ELEMENT_COST, SERVED_DIGEST, outputs, raw_tensor
from edge_sync.serve.body import Charge
from edge_sync.serve.codec import dims, parse_request
from edge_sync.serve.core import Work
from edge_sync.serve.proto import oip_v2_pb2 as pb

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine, TensorDecl
    from edge_sync.serve.core import Inference

__all__ = ["SERVICE", "STATUS", "GrpcServer"]

SERVICE: Final = "inference.GRPCInferenceService"
"""The service's name in the protocol (every client calls ``/<SERVICE>/<method>``)."""
STATUS: Final = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}
"""The gRPC status of each HTTP status REST refuses with."""
_CONTENTS: Final = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
"""Which field of ``InferTensorContents`` holds each datatype's values (FP16 has none:
it travels as raw contents)."""
_IDLE_MS: Final = 300_000
_STREAMS_PER_CONNECTION: Final = 64


class GrpcServer:
    """The gRPC listener over a serving core (:meth:`start`, :meth:`stop`)."""

    def __init__(
        self,
        core: Inference,
        version: str,
        address: str,
        *,
        max_connections: int = 1024,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        """Build the server (``address``: HOST:PORT, port 0 for any free one; at most
        ``max_connections`` open, each refused that has not finished its HTTP/2
        handshake within ``handshake_timeout_s``)."""
        limits = core.limits
        self.core, self.version, self.address = core, version, address
        workers = limits.max_concurrent
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="oip-grpc"),
            handlers=[_handlers(self)],
            maximum_concurrent_rpcs=workers + limits.max_queued,
            options=[
                ("grpc.max_receive_message_length", limits.max_body_bytes),
                ("grpc.max_send_message_length", limits.max_request_bytes),
                ("grpc.max_concurrent_streams", _STREAMS_PER_CONNECTION),
                ("grpc.max_connection_idle_ms", _IDLE_MS),
                ("grpc.max_allowed_incoming_connections", max_connections),
                ("grpc.server_handshake_timeout_ms", round(handshake_timeout_s * 1000)),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.port = 0

    def start(self) -> str:
        """Start serving; the address it listens on (a port 0 resolved).

        Raises:
            OSError: it cannot listen there.
        """
        try:
            self.port = self._server.add_insecure_port(self.address)
        except RuntimeError as e:
            raise OSError(f"cannot serve gRPC on {self.address}: {e}") from None
        if not self.port:
            raise OSError(f"cannot serve gRPC on {self.address}")
        self._server.start()
        host = self.address.rpartition(":")[0]
        return f"{host}:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls; those running get ``grace_s`` to finish."""
        self._server.stop(grace_s).wait()

    # --- the protocol's calls -----------------------------------------------------------

    def server_live(self, _request: Any, _context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, _request: Any, _context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.core.ready())

    def server_metadata(self, _request: Any, _context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name="modelreg", version=self.version, extensions=["binary_tensor_data"]
        )

    def model_ready(self, request: Any, context: Any) -> Any:
        try:
            with self.core.engine(request.name, request.version or None):
                return pb.ModelReadyResponse(ready=True)
        except RefusedError as e:
            if e.status == 503:  # known, not loaded yet: an answer, not an error
                return pb.ModelReadyResponse(ready=False)
            _abort(context, e)

    def model_metadata(self, request: Any, context: Any) -> Any:
        try:
            with self.core.engine(request.name, request.version or None) as engine:
                return pb.ModelMetadataResponse(
                    name=engine.model,
                    versions=self.core.host.versions(engine.model) or [engine.version],
                    platform="onnxruntime_onnx",
                    inputs=_specs(engine.inputs),
                    outputs=_specs(engine.outputs),
                )
        except RefusedError as e:
            _abort(context, e)

    def repository_index(self, request: Any, _context: Any) -> Any:
        index = self.core.index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(name=n, version=v, state=s, reason=r)
                for n, v, s, r in index
            ]
        )

    def model_infer(self, request: Any, context: Any) -> Any:
        start = time.perf_counter()
        work = Work()
        status, version = 500, ""  # a bug answers UNKNOWN: counted as the server's
        try:
            response = self._infer(request, context, work)
        except RefusedError as e:
            status, version = e.status, e.version
            _abort(context, e)
        else:
            status, version = 200, response.model_version
            return response
        finally:
            seconds = time.perf_counter() - start
            self.core.settle(request.model_name, version, status, seconds, work, "grpc")

    def _infer(self, request: Any, context: Any, work: Work) -> Any:
        core = self.core
        ticket = core.budget.ticket(core.limits.max_request_bytes)
        try:
            ticket.charge(request.ByteSize(), "received")
            with core.engine(request.model_name, request.model_version or None) as engine:
                doc, binary = _as_doc(request, ticket.charge)
                parsed = parse_request(doc, engine, binary, core.limits, ticket.charge)
                del binary
                left = context.time_remaining()
                if left is not None and left <= 0:
                    raise _LateError
                results = core.run(engine, parsed.inputs, parsed.wanted, work)
                parsed.inputs.clear()
                arrays = outputs(engine, parsed, results, binary=True)
                return _response(engine, request.id, arrays)
        finally:
            ticket.release()


class _LateError(RefusedError):
    """The call's deadline passed before its run: the client's clock, never counted
    against the version (408, as REST answers a request that comes too slowly)."""

    def __init__(self) -> None:
        super().__init__(408, "the call's deadline passed before it ran")


def _abort(context: Any, error: RefusedError) -> None:
    """End the call with the gRPC status of ``error`` (raises)."""
    if error.version:
        context.set_trailing_metadata((("x-model-version", error.version),))
    code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(error, _LateError) else (
        STATUS.get(error.status, grpc.StatusCode.UNKNOWN)
    )  # fmt: skip
    context.abort(code, str(error))


def _specs(specs: Sequence[TensorDecl]) -> list[Any]:
    from edge_sync.engine.base import DATATYPES

    return [
        pb.ModelMetadataResponse.TensorMetadata(name=n, datatype=DATATYPES.get(t, t), shape=dims(s))
        for n, t, s in specs
    ]


def _param(value: Any) -> object:
    """An ``InferParameter``'s value."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _as_doc(request: Any, charge: Charge) -> tuple[dict[str, Any], bytes]:
    """The request in the protocol's JSON form with every input as binary data, and
    that data after each other (what ``edge_sync.serve.codec`` reads and checks).
    Typed contents are turned into raw bytes here, each charged to ``charge`` before
    anything is made of it (a message of 64 MiB of tiny values would otherwise become
    gigabytes of Python objects).

    Raises:
        RefusedError: raw contents that are not one per input, an input with both or
            neither of typed and raw contents, typed values in the wrong field or out
            of their datatype's range (400); and what ``charge`` raises.
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RefusedError(
            400, f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: one each"
        )
    items, data = [], []
    for i, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):
            raise RefusedError(400, f"input {tensor.name!r}: both contents and raw contents")
        part = raw[i] if raw else _typed_bytes(tensor, charge)
        parameters = {k: _param(v) for k, v in tensor.parameters.items()}
        parameters["binary_data_size"] = len(part)
        items.append({"name": tensor.name, "shape": list(tensor.shape),
                      "datatype": tensor.datatype, "parameters": parameters})  # fmt: skip
        data.append(part)
    doc: dict[str, Any] = {
        "inputs": items,
        "parameters": {k: _param(v) for k, v in request.parameters.items()},
    }
    if request.outputs:
        doc["outputs"] = [
            {"name": o.name, "parameters": {k: _param(v) for k, v in o.parameters.items()}}
            for o in request.outputs
        ]
    if request.id:
        doc["id"] = request.id
    charge(sum(len(d) for d in data))  # the copy below
    return doc, b"".join(data)


def _typed_bytes(tensor: Any, charge: Charge) -> bytes:
    """An input's typed contents as the binary data extension writes them, from the
    field its datatype takes (little-endian; BYTES: each a 4-byte length and its
    bytes), charged before they are read.

    Raises:
        RefusedError: no such field for the datatype, values in another field, or a
            value out of the datatype's range (400).
    """
    import numpy as np

    datatype = tensor.datatype
    field = _CONTENTS.get(datatype)
    if field is None:
        raise RefusedError(
            400, f"input {tensor.name!r}: {datatype} values travel as raw_input_contents"
        )
    contents = tensor.contents
    others = [f.name for f, _ in contents.ListFields() if f.name != field]
    if others:
        raise RefusedError(
            400, f"input {tensor.name!r}: {datatype} values go in {field}, not {others[0]}"
        )
    values = getattr(contents, field)
    count = len(values)
    if datatype == "BYTES":
        charge(count * BYTES_ELEMENT_COST)  # a bytes object and its length, each
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    charge(count * 8 * 3)  # read wide, narrowed, written out
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    if dtype.kind in "iu":  # 8- and 16-bit values travel widened: in range?
        wide = np.asarray(values, dtype=np.int64 if dtype.kind == "i" else np.uint64)
        info = np.iinfo(dtype)
        if count and (wide.min() < info.min or wide.max() > info.max):
            raise RefusedError(
                400, f"input {tensor.name!r}: data is not {datatype} (a value out of its range)"
            )
    else:
        wide = np.asarray(values, dtype=dtype)
    return wide.astype(dtype.newbyteorder("<")).tobytes()


def _response(engine: Engine, request_id: str, arrays: dict[str, Any]) -> Any:
    response = pb.ModelInferResponse(
        model_name=engine.model, model_version=engine.version, id=request_id
    )
    digest = engine.request.served_sha256
    if digest is not None:
        response.parameters[SERVED_DIGEST].string_param = digest
    for name, value in arrays.items():
        datatype, shape, data = raw_tensor(name, value)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(data)
    return response


def _handlers(server: GrpcServer) -> Any:
    def unary(call: Callable[[Any, Any], Any], request: Any, response: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ServerLive": unary(server.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": unary(
                server.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse
            ),
            "ServerMetadata": unary(
                server.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
            ),
            "ModelReady": unary(server.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ModelMetadata": unary(
                server.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
            ),
            "ModelInfer": unary(server.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
            "RepositoryIndex": unary(
                server.repository_index, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse
            ),
        },
    )
