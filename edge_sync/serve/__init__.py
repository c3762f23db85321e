"""The Open Inference Protocol v2 server: the app, its codec, bounds, metrics and the
request recorder the health gate reads."""
