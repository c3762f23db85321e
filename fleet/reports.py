"""Reading the reports devices send (stable API): from a folder (or ``file://``), an
``s3://bucket/prefix/``, or an ``http(s)://`` folder listing.

Each device writes ``<device-id>.json`` under one prefix (``edge.yaml``'s ``report.url``);
an S3 bucket is read with ``registry.s3client``'s client, the one rule for endpoint,
region and credentials the devices follow too (unsigned without credentials).
A report is untrusted input: read with a size cap before parsing, checked against the
strict schema (:mod:`registry.device_report`), and named after the device it describes
(with per-device credentials that may write only their own object, the name is the
identity the store checked; a report that claims another device is refused).  One
report that cannot be read is listed with its reason, never hides the others; only a
source that cannot be listed at all is an error (:class:`ReportsError`).

An HTTP source is a folder URL ending in ``/`` whose listing is JSON: nginx's
``autoindex_format json`` (objects with ``name`` and ``type``), or a plain array of
names.  Entries whose name starts with ``.`` (temporary files of an atomic write) or
does not end in ``.json`` are not reports and are passed over.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from registry.device_report import (
    DEVICE_ID_RE,
    LIMITS,
    DeviceReport,
    ReportError,
    ReportLimits,
    parse_report,
)
from registry.errors import FileTooLargeError, RegistryError, UnsafeFileError, one_line
from registry.redact import redact
from registry.repository import no_gc
from registry.s3client import S3Network, S3UnavailableError, s3_client
from registry.safe_io import folder_reader
from signing.device_reports import is_envelope, open_envelope
from signing.errors import VerificationError

if TYPE_CHECKING:
    from fleet.trust import ReportTrust

__all__ = [
    "Entry",
    "FleetLimits",
    "LoadedReports",
    "ReportsError",
    "Unreadable",
    "load_reports",
    "read_entry",
]

_DEVICE_ID: Final = re.compile(DEVICE_ID_RE)
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class ReportsError(RegistryError):
    """The reports cannot be read at all: the folder, bucket or listing is missing or
    refused."""


@dataclass(frozen=True)
class FleetLimits:
    """Bounds on reading a fleet's reports.

    Attributes:
        max_reports: reports read; the rest of a listing is counted, not read.
        report: the bounds on each report.
        max_listing_bytes: an HTTP listing document.
        timeout_s: each network request (connect and each read).
        workers: network requests in flight at once (S3, HTTP).
    """

    max_reports: int = 100_000
    report: ReportLimits = LIMITS
    max_listing_bytes: int = 32 << 20
    timeout_s: float = 10.0
    workers: int = 16


@dataclass(frozen=True)
class Unreadable:
    """A report that could not be used: where it is, and one line saying why."""

    source: str
    reason: str


@dataclass(frozen=True)
class LoadedReports:
    """What one source held.

    Attributes:
        source: the source read (credentials removed).
        reports: every report that counts, one per device: with enrolled devices
            (``trust`` given to :func:`load_reports`), only those signed by their
            device and newer than the last one seen from it.
        unreadable: the entries that could not be read, each with its reason.
        skipped: reports listed beyond :attr:`FleetLimits.max_reports` (not read).
        untrusted: reports read but not counted (unsigned, unenrolled, forged,
            replayed), each with its reason; they never move a wave.
        authenticated: whether the reports were checked against enrolled keys.
    """

    source: str
    reports: list[DeviceReport] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    skipped: int = 0
    untrusted: list[Unreadable] = field(default_factory=list)
    authenticated: bool = False


@dataclass(frozen=True)
class Entry:
    """One stored report as read: the report, its signed envelope (None: sent bare) and
    the SHA-256 of the report's bytes."""

    report: DeviceReport
    envelope: dict[str, Any] | None
    digest: str


def _is_report_name(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def read_entry(name: str, data: bytes, limits: ReportLimits = LIMITS) -> DeviceReport:
    """One report stored as ``name`` (``<device-id>.json``), bare or in its envelope
    (whose signature is not checked here: :func:`load_reports` does with ``trust``).

    Raises:
        ReportError: the name is no device id, the content is not a report (size,
            JSON, schema), or it reports another device than its name says.
    """
    return _entry(name, data, limits).report


def _entry(name: str, data: bytes, limits: ReportLimits) -> Entry:
    device = name.removesuffix(".json")
    if not _DEVICE_ID.match(device):
        raise ReportError("the name is not <device-id>.json")
    if len(data) > limits.max_stored_bytes:
        raise ReportError(f"larger than {limits.max_stored_bytes} bytes")
    envelope = _envelope(name, data)  # signed by its device (checked by ReportTrust)
    payload = data if envelope is None else open_envelope(envelope, name)
    report = parse_report(payload, limits)
    if report.device != device:
        raise ReportError(f"reports device {report.device!r}, not the device it is named after")
    return Entry(report, envelope, hashlib.sha256(payload).hexdigest())


def _envelope(name: str, data: bytes) -> dict[str, Any] | None:
    """The envelope ``data`` is, or None for a bare report (parsed once either way: ours
    name their payload type first; another writer's order costs a second look)."""
    if not data.startswith(b'{"payloadType"') and b'"payloadType"' not in data:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ReportError("not a JSON document") from None
    if not is_envelope(doc):
        return None
    try:
        open_envelope(doc, name)
    except VerificationError as e:
        raise ReportError(str(e).removeprefix(f"{name}: ")) from None
    return dict(doc)


def _collect(
    source: str,
    names: list[str],
    skipped: int,
    fetch: Callable[[str], bytes],
    limits: FleetLimits,
    *,
    workers: int,
    trust: ReportTrust | None,
) -> LoadedReports:
    """Fetch and read each named report (``workers`` at a time); keep every failure;
    with ``trust``, count only the reports it accepts (in name order: one decision per
    device, against what was seen from it before)."""
    loaded = LoadedReports(source=source, skipped=skipped, authenticated=trust is not None)

    def one(name: str) -> Entry | Unreadable:
        try:
            return _entry(name, fetch(name), limits.report)
        except FileTooLargeError:
            return Unreadable(name, f"larger than {limits.report.max_stored_bytes} bytes")
        except (ReportError, UnsafeFileError) as e:
            return Unreadable(name, one_line(redact(str(e))))
        except OSError as e:  # gone since it was listed, or not readable
            return Unreadable(name, one_line(redact(e.strerror or str(e))))

    # thousands of small objects that all stay alive: no collector passes over them
    with no_gc():
        if workers > 1 and len(names) > 1:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet-read") as pool:
                results: Iterable[Entry | Unreadable] = list(pool.map(one, names))
        else:
            results = map(one, names)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, Unreadable):
                loaded.unreadable.append(result)
                continue
            reason = trust.judge(result) if trust is not None else None
            if reason is None:
                loaded.reports.append(result.report)
            else:
                loaded.untrusted.append(Unreadable(name, reason))
    if trust is not None:
        trust.save()
    return loaded


def _limit(names: Iterable[str], limits: FleetLimits) -> tuple[list[str], int]:
    chosen = sorted(n for n in names if _is_report_name(n))
    return chosen[: limits.max_reports], max(0, len(chosen) - limits.max_reports)


def _folder(path: Path, limits: FleetLimits, trust: ReportTrust | None) -> LoadedReports:
    try:
        with os.scandir(path) as entries:
            names, skipped = _limit((e.name for e in entries), limits)
    except FileNotFoundError:
        raise ReportsError(f"{path}: no such folder") from None
    except NotADirectoryError:
        raise ReportsError(f"{path}: not a folder") from None
    except OSError as e:
        raise ReportsError(f"{path}: cannot list it ({e.strerror or e})") from None

    try:
        # no link, nothing but a regular file, never more than the cap read; one
        # thread: the files are local, and parsing holds the interpreter anyway
        with folder_reader(path, max_bytes=limits.report.max_stored_bytes) as read:
            return _collect(str(path), names, skipped, read, limits, workers=1, trust=trust)
    except OSError as e:  # the folder itself (each file's errors are kept per file)
        raise ReportsError(f"{path}: cannot read it ({e.strerror or e})") from None


def _s3(url: str, limits: FleetLimits, trust: ReportTrust | None) -> LoadedReports:
    network = S3Network(timeout_s=limits.timeout_s, retries=2, pool=max(limits.workers, 10))
    try:
        client = s3_client(network=network)
        from botocore.exceptions import BotoCoreError, ClientError
    except (S3UnavailableError, ImportError):
        raise ReportsError(f"{url}: s3:// sources need boto3 (pip install boto3)") from None
    parsed = urllib.parse.urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    keys: list[str] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            keys += [item["Key"][len(prefix) :] for item in page.get("Contents", [])]
            if len(keys) > 10 * limits.max_reports:  # a listing without end
                break
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "error")
        raise ReportsError(f"{url}: cannot list the reports (S3 {code})") from None
    except BotoCoreError as e:
        raise ReportsError(f"{url}: cannot list the reports ({e})") from None
    names, skipped = _limit(keys, limits)

    def fetch(name: str) -> bytes:
        cap = limits.report.max_stored_bytes
        try:
            response = client.get_object(Bucket=bucket, Key=prefix + name, Range=f"bytes=0-{cap}")
            with response["Body"] as body:
                data: bytes = body.read(cap + 1)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "error")
            raise ReportError(f"S3 {code}") from None
        except BotoCoreError as e:
            raise ReportError(f"S3: {e}") from None
        if len(data) > cap or int(response.get("ContentLength", 0)) > cap:
            raise ReportError(f"larger than {cap} bytes")
        return data

    return _collect(url, names, skipped, fetch, limits, workers=limits.workers, trust=trust)


def _get(url: str, cap: int, timeout_s: float) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            data: bytes = response.read(cap + 1)
    except urllib.error.HTTPError as e:
        e.close()
        raise ReportError(f"HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ReportError(f"cannot reach it ({reason})") from None
    if len(data) > cap:
        raise ReportError(f"larger than {cap} bytes")
    return data


def _listed_names(listing: Any) -> list[str]:
    """Names from a JSON folder listing (nginx ``autoindex_format json``, or names)."""
    if not isinstance(listing, list):
        raise ReportsError("the listing is not a JSON array")
    names = []
    for entry in listing:
        if isinstance(entry, str):
            names.append(entry)
        elif (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and entry.get("type", "file") == "file"
        ):
            names.append(entry["name"])
    return [n for n in names if "/" not in n]


def _http(url: str, limits: FleetLimits, trust: ReportTrust | None) -> LoadedReports:
    if not url.endswith("/"):
        raise ReportsError(f"{redact(url)}: an HTTP source is a folder URL ending in /")
    try:
        raw = _get(url, limits.max_listing_bytes, limits.timeout_s)
        listing = json.loads(raw)
    except ReportError as e:
        raise ReportsError(f"{redact(url)}: cannot list the reports ({e})") from None
    except ValueError:
        raise ReportsError(f"{redact(url)}: the listing is not JSON") from None
    try:
        names, skipped = _limit(_listed_names(listing), limits)
    except ReportsError as e:
        raise ReportsError(f"{redact(url)}: {e}") from None

    def fetch(name: str) -> bytes:
        return _get(
            url + urllib.parse.quote(name), limits.report.max_stored_bytes, limits.timeout_s
        )

    return _collect(redact(url), names, skipped, fetch, limits, workers=limits.workers, trust=trust)


def load_reports(
    url: str, limits: FleetLimits | None = None, *, trust: ReportTrust | None = None
) -> LoadedReports:
    """Every device report under ``url``: a folder, ``file://``, ``s3://bucket/prefix/``
    or an ``http(s)://`` folder listing.

    Args:
        url: the source.
        limits: bounds on reading it.
        trust: the enrolled devices and what was seen from them (``fleet.trust``):
            only the reports it accepts count, the others are listed apart.  None: no
            device is enrolled, every readable report counts (unauthenticated).

    Raises:
        ReportsError: the source cannot be listed (missing, refused, unreachable).
    """
    limits = limits or FleetLimits()
    if not _SCHEME.match(url):
        return _folder(Path(url).expanduser(), limits, trust)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "file":
        folder = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        return _folder(folder, limits, trust)
    if scheme == "s3":
        return _s3(url, limits, trust)
    if scheme in ("http", "https"):
        return _http(url, limits, trust)
    raise ReportsError(f"{redact(url)}: reports are read from a folder, s3:// or http(s)://")
