"""Agent Conversation Service control plane."""
