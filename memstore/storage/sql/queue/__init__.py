"""The durable queue's rows: enqueue and settle, claims and leases, operator views."""
