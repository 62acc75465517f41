"""Runtimes behind the sandbox manager. Only drivers/docker/driver.py imports docker."""
