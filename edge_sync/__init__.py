"""The edge daemon: follows a model repository, verifies what it receives, hot-swaps engines."""
