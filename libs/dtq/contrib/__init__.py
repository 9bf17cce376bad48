"""Integrations with other libraries, each importable only with its extra installed:
:mod:`dtq.contrib.otel` (``dtq[otel]``), :mod:`dtq.contrib.sentry` (``sentry-sdk``),
:mod:`dtq.contrib.fastapi` (``dtq[api]``)."""
