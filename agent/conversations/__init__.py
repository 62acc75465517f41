"""Conversations: the agent loop, its tools, events and webhooks (docs/agent-protocol.md)."""
