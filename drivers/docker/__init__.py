"""The Docker runtime: a sandbox is a container and a workspace volume on one engine
(driver.py: DockerDriver)."""
