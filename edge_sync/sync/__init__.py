"""One sync: the watcher and the metadata sources, trust (python-tuf), the transports
(file, HTTP, S3), the updater and its health gates, the report to the fleet."""
