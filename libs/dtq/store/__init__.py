"""The Redis layer: connections (plain, TLS, Sentinel, Cluster), the fast lane, key names, the
task record's fields, partitioned queues, and the checks on the server (eviction policy)."""
