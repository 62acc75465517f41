"""The audit log above the stores: which route is which action, the middleware that opens each
request's audit scope, search and export, and the sinks (the writer: store/audit.py)."""
