"""Sandboxes: Docker containers started from spec templates, with their state in Redis."""
