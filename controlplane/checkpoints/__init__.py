"""Checkpoints of conversations: one at each user message, rewind and fork from them."""
