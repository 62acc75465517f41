"""One id per test session: every Docker object the tests make carries it in its name."""

import secrets

RUN_ID = secrets.token_hex(3)
