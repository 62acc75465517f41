"""The sandbox proxy: one authenticated way in to every sandbox's ports (routes.py), over a
forwarding core that streams HTTP and WebSocket both ways (forward.py)."""
