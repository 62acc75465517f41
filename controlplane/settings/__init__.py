"""Per-user settings, MCP configuration, git provider tokens and custom secrets."""
