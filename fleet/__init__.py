"""The fleet as its devices report it: ``modelreg fleet status``.

``reports`` reads the reports devices send (a folder, ``s3://``, an HTTP listing), as
untrusted input; ``summary`` aggregates them (pure): devices per model and version,
each channel's rollout progress (:func:`fleet.summary.channel_progress`), stale devices.
The report's schema is shared with the devices that write it: ``registry.device_report``.
"""
