"""Byte-exact, ONNX-aware binary deltas between two model files (stable API).

``encode(base, new)`` runs on CI and describes ``new`` as instructions against ``base``;
``decode(base, delta)`` runs on the device and rebuilds ``new`` bit for bit, verified
against the SHA-256 of ``new`` that the delta carries (and, optionally, the signed digest
from TUF).  The decoder needs ``numpy`` and ``zstandard`` only, never ``onnx``.

How ``new`` is described (mode ``onnx``, when both files parse as ONNX models):

* ``COPY base_offset length``: unchanged bytes, taken from the base file;
* ``XOR base_offset length planes``: a tensor present in both files with the same name,
  dtype and shape; the payload is the XOR of the two byte ranges, split into byte planes
  (for float32: every value's byte 0, then every byte 1, ...) and zstd-compressed, because
  a fine-tune leaves sign and exponent bytes mostly unchanged;
* ``PLANES length planes``: a new tensor, byte-plane split and zstd-compressed;
* ``INSERT length``: literal bytes (protobuf framing, graph nodes) taken in order from one
  zstd-compressed literal stream.

An ONNX external data file (raw tensor bytes at spans its ``.onnx`` names) gets mode
``onnx`` too, from :func:`encode_external`: the caller gives both files' tensors (from
``registry.onnx_wire.external_initializers``), the bytes between them are literals, and
the encoder streams both files by ranges (memory: a few 4 MiB pieces, whatever the size).

A file that does not parse as ONNX gets mode ``patch``: one zstd frame of ``new`` compressed
with ``base`` as a raw-content dictionary (what ``zstd --patch-from`` does).

Byte layout of format version 1 (integers little-endian)::

    offset        size  field
    0             8     magic b"\\x89MRDLT\\r\\n"
    8             2     format version (1)
    10            1     mode: 1 = onnx instructions, 2 = zstd patch
    11            1     flags (0)
    12            4     instruction count N (0 in mode patch)
    16            8     base length
    24            32    base SHA-256
    56            8     new length
    64            32    new SHA-256
    96            8     literal section length L
    104           8     payload section length P
    112           32*N  instructions: op u8, planes u8, reserved u16 + u32 (0),
                        a u64, b u64, c u64
                          COPY   (1): a = base offset, b = length
                          INSERT (2): b = length (from the literal stream)
                          XOR    (3): a = base offset, b = length, c = payload length
                          PLANES (4): b = length, c = payload length
    112+32N       L     literal section: one zstd frame (the patch frame in mode patch)
    ...           P     payload section: the XOR/PLANES zstd frames, in instruction order
    end-32        32    SHA-256 of every byte before it

Decoding checks the trailer first (any flipped or missing byte is a
:class:`CorruptDeltaError` before a byte is written), then the whole instruction table
against :class:`DeltaLimits` and the header, and the base's length; then it streams the
output, hashing it, to a temporary file beside ``out`` (renamed into place only once its
SHA-256 matches) or to memory.  The base's own SHA-256 is computed only when the result's
is wrong, to tell a wrong base (:class:`BaseMismatchError`) from a corrupt delta: a result
with the expected digest is right whatever base produced it, and skipping a full read and
hash of the base is a third of the decoding time.

Memory stays bounded by the largest instruction (4 MiB as written, ``max_instruction_size``
as accepted) plus the literal stream's 8 MiB zstd window, whatever the model size; inputs
given as paths are read by ranges.  Mode ``patch`` is the exception: zstd needs the whole
base as its dictionary and a window spanning both files.

Exceptions::

    RegistryError
    └── DeltaError              a delta cannot be applied
        ├── CorruptDeltaError   malformed, truncated, over a limit, or yields the wrong digest
        └── BaseMismatchError   the base given is not the file the delta was made against

Misuse (a bad argument) raises ``ValueError``; I/O failures raise ``OSError``.
"""

from registry.delta._api import decode, encode, encode_external, read_header
from registry.delta._format import FORMAT_VERSION, DeltaHeader, DeltaLimits
from registry.delta.errors import BaseMismatchError, CorruptDeltaError, DeltaError

__all__ = [
    "FORMAT_VERSION",
    "BaseMismatchError",
    "CorruptDeltaError",
    "DeltaError",
    "DeltaHeader",
    "DeltaLimits",
    "decode",
    "encode",
    "encode_external",
    "read_header",
]
