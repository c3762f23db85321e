"""The device's report to its fleet (``edge.yaml``'s ``report``): the ``edge status``
document plus the device's labels, the time it was sent and the daemon's version
(``registry.device_report``), written as ``<device-id>.json`` to a folder, an S3
bucket or an HTTP PUT URL.

A :class:`Reporter` runs in a thread of its own, so a slow or dead sink never delays a
sync or a request.  It sends when the document changed (an install, a failure, a
rejection, a rollback, a restart; a sync that changed nothing does not count) and at
each heartbeat, which tells the fleet that the device is alive.  A send that fails is
logged once until the report or the reason changes, and tried again at the next change
or heartbeat; every send runs under the configured time limit.  Nothing here stops the
daemon: the worst a broken sink does is a line in the log.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from edge_sync import clock
from edge_sync.config import EdgeConfig, ReportConfig
from edge_sync.errors import SendError
from edge_sync.state.device_key import DeviceKey
from edge_sync.state.models import reason_text
from registry.atomic import write_atomic
from registry.device_report import (
    KIND,
    REPORT_FORMAT,
    DaemonReport,
    DaemonStatus,
    DeviceReport,
    ReportError,
    StatusDocument,
    encode_report,
)
from registry.errors import UsageError
from registry.redact import redact
from registry.s3client import S3Network, S3UnavailableError, s3_client

__all__ = [
    "LAST_REPORT_S",
    "TOKEN_ENV",
    "FolderSink",
    "HttpSink",
    "Reporter",
    "S3Sink",
    "Sink",
    "report_document",
    "sink_for",
]

TOKEN_ENV: Final = "MODELREG_REPORT_TOKEN"  # noqa: S105 - the variable's name
"""A bearer token for an HTTP sink, when ``report.credentials`` names no file."""
_VOLATILE: Final = (("reported",), ("sync", "last_checked"))
"""What changes at every poll without anything happening: no reason to send."""
_MAX_CREDENTIALS_BYTES: Final = 64 * 1024
LAST_REPORT_S: Final = 5.0
"""How long a stopping daemon waits for its last report (and a send in progress before
it): a slow sink must not hold up the stop."""


class Sink(Protocol):
    """Where reports go: one object per device."""

    where: str
    """The destination, as the log shows it (no credentials)."""

    def send(self, data: bytes) -> None:
        """Store ``data`` as this device's report.

        Raises:
            SendError: the sink refused it or could not be reached in time.
            OSError: a local folder could not be written.
        """
        ...  # pragma: no cover - protocol


def report_document(
    config: EdgeConfig, status: StatusDocument, version: str, *, stopped: bool = False
) -> DeviceReport:
    """The report: ``status`` (the ``edge status`` document) with the report's fields.

    ``/status``'s live-only parts (its engines) are not in it: the report says what the
    device runs, not how its memory is split.  ``stopped``: the daemon's last report,
    sent while it stops; its daemon reads as ``edge status`` shows one not running.
    Built unchecked, as the document is; :func:`encode_report` checks it.
    """
    daemon = DaemonStatus.model_construct(running=False) if stopped else status.daemon
    held = {name: getattr(status, name) for name in StatusDocument.model_fields}
    return DeviceReport.model_construct(
        kind=KIND,
        format=REPORT_FORMAT,
        **held | {"daemon": DaemonReport.model_construct(**dict(daemon), version=version)},
        labels=dict(config.device.labels),
        reported=clock.now(),
    )


def _fingerprint(doc: Mapping[str, Any]) -> str:
    """A digest of what the report (as JSON data) says, less what changes at every poll."""
    copy = json.loads(json.dumps(doc))
    for path in _VOLATILE:
        node = copy
        for part in path[:-1]:
            node = node.get(part) or {}
        node.pop(path[-1], None)
    return hashlib.sha256(json.dumps(copy, sort_keys=True).encode()).hexdigest()


def _object_url(url: str, device: str) -> str:
    quoted = urllib.parse.quote(device, safe="")
    return url.replace("{device}", quoted) if "{device}" in url else f"{url}{quoted}.json"


def _read_secret(path: str) -> str:
    try:
        with open(path, "rb") as fh:  # noqa: PTH123 - bounded read of a small file
            return fh.read(_MAX_CREDENTIALS_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8 text"
        raise SendError(f"{path}: cannot read the report credentials ({why})") from None


class FolderSink:
    """``<folder>/<device-id>.json``, replaced atomically (a reader never sees half)."""

    def __init__(self, folder: Path, device: str) -> None:
        """Write ``device``'s report into ``folder`` (created when missing)."""
        self.path = folder / f"{device}.json"
        self.where = str(folder)

    def send(self, data: bytes) -> None:
        """Replace the report file.

        Raises:
            OSError: the folder cannot be written (full, read-only, gone).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, data, mode=0o644)


class HttpSink:
    """An HTTP PUT of the report to one URL per device."""

    def __init__(self, url: str, timeout_s: float, credentials: str | None = None) -> None:
        """PUT to ``url``; a bearer token from the ``credentials`` file, else from
        :data:`TOKEN_ENV` (when set)."""
        self.url = url
        self.where = redact(url)
        self.timeout_s = timeout_s
        self.credentials = credentials

    def _token(self) -> str | None:
        if self.credentials is not None:  # read at each send: a rotated token is taken
            return _read_secret(self.credentials).strip() or None
        return os.environ.get(TOKEN_ENV) or None

    def send(self, data: bytes) -> None:
        """PUT the report.

        Raises:
            SendError: an answer other than 2xx, or no answer within the time limit.
        """
        headers = {"Content-Type": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url, data=data, method="PUT", headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                response.read(4096)
        except urllib.error.HTTPError as e:
            with e:
                raise SendError(f"HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise SendError(f"cannot reach it ({getattr(e, 'reason', None) or e})") from None


class S3Sink:
    """``s3://bucket/<prefix><device-id>.json``, with this device's credentials."""

    def __init__(self, url: str, timeout_s: float, credentials: str | None = None) -> None:
        """Put to the object ``url`` names; the keys of the ``credentials`` file's
        ``[default]`` section, else the standard AWS configuration (environment,
        ``~/.aws``, an instance role); the endpoint and region as ``registry.s3client``
        says (``AWS_ENDPOINT_URL_S3`` for a compatible store)."""
        parsed = urllib.parse.urlparse(url)
        self.bucket, self.key = parsed.netloc, parsed.path.lstrip("/")
        self.where = f"s3://{self.bucket}/{self.key}"
        self.timeout_s = timeout_s
        self.credentials = credentials

    def _keys(self) -> dict[str, str]:
        if self.credentials is None:
            return {}
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(_read_secret(self.credentials))
        except configparser.Error:
            raise SendError(f"{self.credentials}: not an AWS credentials file") from None
        section = parser["default"] if parser.has_section("default") else None
        names = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        keys = {n: section[n].strip() for n in names if section is not None and n in section}
        if not {"aws_access_key_id", "aws_secret_access_key"} <= set(keys):
            raise SendError(
                f"{self.credentials}: no [default] section with aws_access_key_id and "
                "aws_secret_access_key"
            )
        return keys

    def _s3(self) -> Any:
        """The client, with the device's keys (``registry.s3client``: a new one when the
        keys or the AWS settings changed, e.g. a rotated credentials file)."""
        network = S3Network(timeout_s=self.timeout_s, retries=1)
        try:
            return s3_client(keys=self._keys(), network=network)
        except S3UnavailableError:
            raise SendError("s3:// report URLs need boto3: install modelreg[edge-s3]") from None

    def send(self, data: bytes) -> None:
        """Put the report object.

        Raises:
            SendError: S3 refused it, or could not be reached in time.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._s3()
        try:
            client.put_object(
                Bucket=self.bucket, Key=self.key, Body=data, ContentType="application/json"
            )
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "error")
            raise SendError(f"S3 {code}") from None
        except BotoCoreError as e:
            raise SendError(f"S3: {e}") from None


def sink_for(report: ReportConfig, device: str) -> Sink:
    """The sink ``report`` names, for ``device``."""
    if report.scheme == "file":
        url = report.url
        if url.startswith("file:"):
            url = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        return FolderSink(Path(url), device)
    url = _object_url(report.url, device)
    if report.scheme == "s3":
        return S3Sink(url, report.timeout, report.credentials)
    return HttpSink(url, report.timeout, report.credentials)


def _stderr(line: str) -> None:
    print(f"modelreg edge: report: {line}", file=sys.stderr, flush=True)


class Reporter:
    """Sends the device's report on change and at each heartbeat (module docstring).

    :meth:`tick` is one decision and at most one send (the tests drive it with a
    clock of their own); :meth:`start` runs it in a thread, woken by :meth:`poke`.
    """

    def __init__(
        self,
        config: EdgeConfig,
        status: Callable[[], StatusDocument],
        version: str,
        *,
        sink: Sink | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = _stderr,
        key: DeviceKey | None = None,
    ) -> None:
        """Report ``config``'s device, reading its status with ``status``; each report
        numbered and signed with ``key`` (the device's: ``edge_sync.state.device_key``),
        sent bare without one.

        Raises:
            UsageError: ``config`` has no ``report`` section and no ``sink`` is given.
        """
        if sink is None:
            if config.report is None:
                raise UsageError("no report sink configured")
            sink = sink_for(config.report, config.device.id)
        self.config = config
        self.heartbeat_s = config.report.heartbeat if config.report else 300.0
        self.sink = sink
        self._key = key
        self._status = status
        self._version = version
        self._clock = clock
        self._log = log
        self._tried_key: str | None = None
        self._last_try: float | None = None
        self._failing: tuple[str, str] | None = None
        """(report, reason) of the failure last logged; None while sends succeed."""
        self.sent = 0
        self._wake = threading.Event()
        self._stopping = False
        self._last = False
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Something may have changed: look now (from any thread)."""
        self._wake.set()

    def tick(self, *, last: bool = False) -> bool | None:
        """Send the report if it changed since the last try or a heartbeat is due.

        Args:
            last: send the daemon's last report (marked stopped), due or not.

        Returns:
            True when sent, False when the send failed, None when nothing was due.
        """
        try:
            report = report_document(self.config, self._status(), self._version, stopped=last)
            doc = report.model_dump(mode="json")
            key = _fingerprint(doc)
        except Exception as e:  # noqa: BLE001 - a corrupt state file: say it, keep going
            self._failed("status", f"cannot read the status: {type(e).__name__}: {e}")
            self._last_try = self._clock()
            return False
        now = self._clock()
        due = last or self._last_try is None or now - self._last_try >= self.heartbeat_s
        if key == self._tried_key and not due:
            return None
        self._tried_key, self._last_try = key, now
        try:
            self.sink.send(self._sealed(doc))
        except (SendError, ReportError) as e:
            self._failed(key, str(e))
            return False
        except OSError as e:
            self._failed(key, e.strerror or str(e))
            return False
        except Exception as e:  # noqa: BLE001 - a sink's bug must not stop the device
            self._failed(key, f"internal error: {type(e).__name__}: {e}")
            return False
        if self._failing is not None:
            self._log(f"sent to {self.sink.where} again")
            self._failing = None
        self.sent += 1
        return True

    def _sealed(self, doc: dict[str, Any]) -> bytes:
        """The report as sent: numbered and signed by the device's key (bare without)."""
        if self._key is None:
            return encode_report(doc)
        doc["sequence"] = self._key.next_sequence()
        return self._key.seal(encode_report(doc))

    def _failed(self, key: str, reason: str) -> None:
        said = reason_text(reason)
        if self._failing != (key, said):
            self._log(f"not sent to {self.sink.where}: {said} (tried again at the next "
                      "change or heartbeat)")  # fmt: skip
            self._failing = (key, said)

    def _run(self) -> None:
        while not self._stopping:
            self.tick()
            now = self._clock()
            since = 0.0 if self._last_try is None else now - self._last_try
            self._wake.wait(max(self.heartbeat_s - since, 0.05))
            self._wake.clear()
        if self._last:
            # here, not in the stopping thread: after any send in progress, so an
            # earlier "running" report cannot land after it
            self.tick(last=True)

    def start(self) -> None:
        """Send now, then on every :meth:`poke` that changed something and at each
        heartbeat, in a thread, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="fleet-report", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0, *, last: bool = False) -> None:
        """Stop the thread; a send in progress is left to finish on its own (its time
        limit bounds it) rather than hold up the daemon's exit beyond ``timeout_s``.

        Args:
            timeout_s: the longest to wait for the thread.
            last: send a last report first, with the daemon marked stopped (a clean
                stop), within ``timeout_s``.
        """
        self._last = last
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(timeout=timeout_s)
