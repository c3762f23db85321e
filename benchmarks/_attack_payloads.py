"""The requests of issue 23's review of the inference port, made byte for byte
(``benchmarks.serving_attacks`` replays them on a daemon process; the edge tests on a
server in theirs).  Each is small on the wire and large once inflated or decoded."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Final

__all__ = [
    "CNN_BATCH", "bytes_bomb", "cnn_batch", "header_line", "json_bomb",
]  # fmt: skip

CNN_BATCH: Final = 21_399
"""The CNN's batch the review asked for: 21,399 images of 1 x 28 x 28 floats, 64 MiB."""


def _gzip(raw: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    return packer.compress(raw) + packer.flush()


def json_bomb(model_input: str = "input", width: int = 16, inflated: int = 61 << 20) -> bytes:
    """A gzip body of about 60 KiB inflating to ``inflated`` bytes of JSON: a request of
    zeros (``"data":[0,0,...]``) for an input of ``width`` values a row."""
    values = (inflated - 100) // 2
    rows = values // width
    head = json.dumps(
        {"inputs": [{"name": model_input, "shape": [rows, width], "datatype": "FP32", "data": []}]}
    ).encode()
    before, after = head.split(b"[]", 1)
    zeros = b"0," * (rows * width - 1) + b"0"
    return _gzip(before + b"[" + zeros + b"]" + after)


def bytes_bomb(count: int = ((64 << 20) - 256) // 4) -> tuple[bytes, dict[str, str]]:
    """A gzip body of about 63 KiB: a BYTES tensor of ``count`` empty strings as
    binary data (each a 4-byte zero length; 16.8 M fill the 64 MiB a body may inflate
    to); its headers."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4 * count},
                }
            ]
        }
    ).encode()
    body = _gzip(header + bytes(4 * count))
    return body, {
        "Content-Encoding": "gzip",
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def cnn_batch(batch: int = CNN_BATCH) -> tuple[bytes, dict[str, str]]:
    """A gzip body of about 31 KiB asking the CNN for ``batch`` images of zeros, as
    binary data; its headers."""
    size = batch * 28 * 28 * 4
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [batch, 1, 28, 28],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": size},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = gzip.compress(header + bytes(size), compresslevel=9)
    return body, {
        "Content-Encoding": "gzip",
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def header_line(size: int = 64 << 20) -> bytes:
    """A request whose one header is ``size`` bytes long (its line never ends until
    then)."""
    return b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
