"""What the tests share: fixtures loaded as plugins by tests/conftest.py (docker_fixtures,
conversation_helpers, openhands_clients), live servers and processes, a real redis-server, the
scripted fake LLM, helpers, and the type aliases every test module uses (types.py)."""
