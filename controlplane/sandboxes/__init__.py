"""Sandboxes: instances of the runtime (drivers/runtimes.py: Docker containers, Kubernetes pods)
started from spec templates, with their state in Redis."""
