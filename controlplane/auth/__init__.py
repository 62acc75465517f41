"""API keys and the principal making a request."""
