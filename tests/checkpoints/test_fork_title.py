"""A fork's default title: the source's marked " (fork)", always a title a start request takes
(a source titled up to the 200 characters the API allows made the fork's start request invalid,
answered 500 after its sandbox was started)."""

from __future__ import annotations

import pytest

from controlplane.checkpoints.service import fork_title
from controlplane.conversations.models import AppConversationStartRequest


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (None, "Conversation (fork)"),
        ("Fix the build", "Fix the build (fork)"),
        ("x" * 193, "x" * 193 + " (fork)"),
        ("x" * 200, "x" * 193 + " (fork)"),
        ("日" * 200, "日" * 193 + " (fork)"),
    ],
)
def test_a_forks_title_is_one_a_start_request_takes(source: str | None, expected: str) -> None:
    title = fork_title(source)
    assert title == expected
    assert AppConversationStartRequest(title=title).title == title
