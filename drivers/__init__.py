"""Runtimes behind the sandbox manager. Only drivers/docker.py imports docker."""
