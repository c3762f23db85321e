"""The load generator's gRPC half (``modelreg.loadgen`` with a ``grpc://host:port/MODEL``
URL): the same closed loop over the Open Inference Protocol's ``ModelInfer``, for the
serving benchmark's gRPC runs against any server of the protocol (ours, MLServer,
Triton).

The request is the JSON body the HTTP runs send, turned once into a ``ModelInferRequest``
with its tensors as ``raw_input_contents`` (what ``tritonclient.grpc`` sends); each answer
is turned back into the JSON form the HTTP runs' checks read (``model_version``, each
output's ``data`` as a flat list), so one check judges both.  Requests are spread over a
few channels (HTTP/2 connections), at most :data:`STREAMS_PER_CHANNEL` in flight on each,
as a pool of clients would.

Needs ``grpcio`` and the protocol's module (``modelreg[edge]``).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from modelreg.loadgen import LoadResult
    from modelreg.loadgen import _Plan as Plan

__all__ = ["STREAMS_PER_CHANNEL", "grpc_target", "run_grpc"]

STREAMS_PER_CHANNEL: Final = 32
_METHOD: Final = "/inference.GRPCInferenceService/ModelInfer"
_NUMPY: Final = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
}  # fmt: skip


def grpc_target(url: str, body: bytes) -> tuple[str, bytes]:
    """``host:port`` and the serialized ``ModelInferRequest`` for ``url``
    (``grpc://host:port/MODEL``) and the JSON request ``body``.

    Raises:
        ValueError: not such a URL, or a body that is not an inference request with
            its data in JSON.
    """
    import numpy as np

    from edge_sync.serve.proto import oip_v2_pb2 as pb

    parts = urlsplit(url)
    model = parts.path.strip("/")
    if parts.scheme != "grpc" or not parts.hostname or not parts.port or not model:
        raise ValueError(f"{url!r}: expected grpc://host:port/MODEL")
    doc = json.loads(body)
    request = pb.ModelInferRequest(model_name=model, id=str(doc.get("id", "")))
    for tensor in doc["inputs"]:
        datatype = tensor["datatype"]
        request.inputs.add(name=tensor["name"], datatype=datatype, shape=tensor["shape"])
        data = np.asarray(tensor["data"], dtype=_NUMPY[datatype]).reshape(-1)
        request.raw_input_contents.append(data.astype(data.dtype.newbyteorder("<")).tobytes())
    return f"{parts.hostname}:{parts.port}", request.SerializeToString()


def _as_doc(answer: bytes) -> dict[str, Any]:
    """An answer in the JSON form the HTTP runs' checks read."""
    import numpy as np

    from edge_sync.serve.proto import oip_v2_pb2 as pb

    response = pb.ModelInferResponse.FromString(answer)
    outputs = []
    for i, tensor in enumerate(response.outputs):
        raw = response.raw_output_contents[i] if i < len(response.raw_output_contents) else b""
        dtype = np.dtype(_NUMPY.get(tensor.datatype, "float32")).newbyteorder("<")
        outputs.append({"name": tensor.name, "datatype": tensor.datatype,
                        "shape": list(tensor.shape),
                        "data": np.frombuffer(raw, dtype).tolist()})  # fmt: skip
    return {"model_name": response.model_name, "model_version": response.model_version,
            "id": response.id, "outputs": outputs}  # fmt: skip


async def run_grpc(address: str, request: bytes, plan: Plan) -> LoadResult:
    """Keep the plan's calls in flight (see the module doc); what they saw.

    Raises:
        LoadError: the server cannot be reached.
    """
    import grpc

    from modelreg.loadgen import LoadError, checked, closed_loop

    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.channel_id", i)])
        for i in range(math.ceil(plan.concurrency / STREAMS_PER_CHANNEL))
    ]
    try:
        try:
            await asyncio.gather(*(asyncio.wait_for(c.channel_ready(), 10) for c in channels))
        except TimeoutError:
            raise LoadError(f"cannot connect to {address}") from None

        def exchange(call: Any) -> Any:
            async def one() -> tuple[int, str | None, str | None]:
                try:
                    answer = await call(request, timeout=plan.timeout_s)
                except grpc.aio.AioRpcError as e:
                    return 0, None, f"gRPC {e.code().name}: {(e.details() or '')[:80]}"
                doc = _as_doc(answer)
                return 200, doc["model_version"] or None, checked(doc, plan.check)

            return one

        calls = [c.unary_unary(_METHOD) for c in channels]
        return await closed_loop(
            [exchange(calls[i % len(calls)]) for i in range(plan.concurrency)], plan
        )
    finally:
        for c in channels:
            await c.close()
