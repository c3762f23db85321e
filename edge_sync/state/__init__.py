"""What a device holds: the state models (``models``), the state dir and its blob store
(``store``), and the status document built from them (``status``)."""
