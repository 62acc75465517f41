"""Conversation events: appended by sandbox webhooks, read by search and a live WebSocket."""
