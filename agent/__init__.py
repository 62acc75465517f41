"""Agent server that runs inside every sandbox container.

Run it with ``python -m agent --port 8000``; see :mod:`agent.__main__`.
"""

__version__ = "0.1.0"
