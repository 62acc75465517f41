"""Operator tooling that talks to a running control plane over its REST API only.

`controlplane sandboxes …` (see `sandboxes.py`) never touches Redis or Docker: it does what a
cron job or a shell script with curl could do, with the same API key and the same permissions.
"""
