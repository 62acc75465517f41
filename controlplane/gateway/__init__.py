"""The LLM gateway: sandboxes and the user's own tools call models through the control plane,
which holds the provider keys (docs/llm-gateway.md)."""
