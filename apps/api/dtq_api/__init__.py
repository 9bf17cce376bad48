"""dtq-api: the HTTP API, the dashboard and the fleet ``/metrics`` of a dtq deployment."""
