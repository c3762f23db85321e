"""ONNX Runtime's own log, through the daemon's Python log (``serve.onnxruntime_log``).

Left alone, ONNX Runtime writes its messages straight to the process's stderr, in
colour, several lines each (a model that fails on zeros while the daemon measures
prepacking printed a raw C++ error into the journal).  :func:`route_onnxruntime_log`
installs a callback (``onnxruntime.set_default_logger_callback``, where this ONNX
Runtime has it) that hands each message to the ``modelreg.onnxruntime`` logger at its own
level, as one line without colours; messages less severe than the configured level
are not made at all.  The daemon's log handler writes them to stderr as
``modelreg edge: onnxruntime <level>: <message> (<where in ONNX Runtime>)``.

Sessions apply their own severity too: :func:`ort_severity` gives the number for
``SessionOptions.log_severity_level``.  ONNX Runtime sends messages from its own
worker threads (threads Python does not know) to its platform sink, not the callback:
a device runs one intra-op thread per session by default, so it has none.  With an
ONNX Runtime too old for the callback only the severity applies.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

from registry.errors import one_line

__all__ = ["LOGGER", "ORT_SEVERITY", "ort_severity", "route_onnxruntime_log"]

LOGGER: Final = "modelreg.onnxruntime"
"""The Python logger ONNX Runtime's messages go to."""
ORT_SEVERITY: Final = {"verbose": 0, "info": 1, "warning": 2, "error": 3, "fatal": 4}
"""``serve.onnxruntime_log`` as ONNX Runtime's severity number."""
_PYTHON_LEVEL: Final = {
    0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL,
}  # fmt: skip
_WORDS: Final = {number: word for word, number in ORT_SEVERITY.items()}


def ort_severity(level: str) -> int:
    """ONNX Runtime's severity number for a ``serve.onnxruntime_log`` level.

    Raises:
        ValueError: not a level (the config refuses it first).
    """
    try:
        return ORT_SEVERITY[level]
    except KeyError:
        raise ValueError(f"not an ONNX Runtime log level: {level!r}") from None


def _forward(severity: int, _category: str, _logid: str, where: str, message: str) -> None:
    """ONNX Runtime's callback: one message, as one line, to :data:`LOGGER`."""
    level = _PYTHON_LEVEL.get(severity, logging.ERROR)
    word = _WORDS.get(severity, "error")
    text = one_line(message, 1000)
    if where:
        logging.getLogger(LOGGER).log(level, "%s: %s (%s)", word, text, one_line(where, 200))
    else:
        logging.getLogger(LOGGER).log(level, "%s: %s", word, text)


def route_onnxruntime_log(level: str) -> bool:
    """Send ONNX Runtime's own messages of ``level`` or more severe to :data:`LOGGER`
    (given a stderr handler in the daemon's format if it has none).

    Returns:
        Whether the messages go through Python's log (False: this ONNX Runtime has no
        logger callback; only its severity was set).

    Raises:
        ValueError: ``level`` is not a level.
    """
    import onnxruntime as ort

    severity = ort_severity(level)
    logger = logging.getLogger(LOGGER)
    logger.setLevel(_PYTHON_LEVEL[severity])
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("modelreg edge: onnxruntime %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # one line each, whatever the root logger does
    install = getattr(ort, "set_default_logger_callback", None)
    if install is None:
        ort.set_default_logger_severity(severity)
        return False
    install(_forward, severity)
    return True
