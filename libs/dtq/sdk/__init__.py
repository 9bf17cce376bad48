"""The client layer: `Client` and `AsyncClient` and what they are built from (the request
builder, group commit of enqueues, result waits, bulk cancel, fair-group operations)."""
