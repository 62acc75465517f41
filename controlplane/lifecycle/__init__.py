"""Lifecycle events of sandboxes and conversations: logged, kept in Redis, sent to webhooks."""
