"""Run in the OpenHands client venv: validate what our agent produced with the SDK's own models.

    python sdk_validate.py dump.json   ->  prints {"checked": {...}, "failures": [...]}

``dump.json`` holds ``events`` (validated as the SDK's ``Event`` union, after importing the
tools whose action/observation kinds they use, as an SDK client does), ``infos``
(ConversationInfo: ``ConversationState`` plus ``MetricsSnapshot``, ``ConversationStats``,
``AgentBase``, ``ConfirmationPolicyBase`` as ``RemoteState`` reads them), ``stats`` and
``start_requests`` (the control plane's bodies, as the SDK's ``StartConversationRequest``).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections import Counter
from typing import Any

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from openhands.sdk.agent.base import AgentBase
from openhands.sdk.conversation.conversation_stats import ConversationStats
from openhands.sdk.conversation.request import StartConversationRequest
from openhands.sdk.conversation.state import (
    ConversationExecutionStatus,
    ConversationState,
)
from openhands.sdk.event.base import Event
from openhands.sdk.llm.utils.metrics import MetricsSnapshot
from openhands.sdk.security.confirmation_policy import ConfirmationPolicyBase
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool

#: Importing the tools registers their action and observation kinds, as an SDK client does.
REGISTERED = (TerminalTool, FileEditorTool)


def check_info(info: dict[str, Any]) -> None:
    fresh = copy.deepcopy  # the SDK's validators pop "kind" from what they are given
    ConversationState.model_validate(fresh(info))
    MetricsSnapshot.model_validate(fresh(info["metrics"]))
    ConversationStats.model_validate(fresh(info["stats"]))
    AgentBase.model_validate(fresh(info["agent"]))
    ConfirmationPolicyBase.model_validate(fresh(info["confirmation_policy"]))
    ConversationExecutionStatus(info["execution_status"])


def check_events(events: list[dict[str, Any]], checked: Counter[str], failures: list[str]) -> None:
    for event in events:
        label = event.get("kind", "?")
        if label == "ActionEvent":
            label += ":" + (event.get("action") or {}).get("kind", "none")
        if label == "ObservationEvent":
            label += ":" + event["observation"].get("kind", "?")
        if label == "ConversationStateUpdateEvent":
            label += ":" + str(event.get("key"))
        try:
            parsed = Event.model_validate(copy.deepcopy(event))  # it pops "kind"
            if type(parsed).__name__ != event["kind"]:
                raise ValueError(f"parsed as {type(parsed).__name__}")
            checked[label] += 1
        except Exception as exc:
            failures.append(f"{label}: {exc}")


def check_start_request(body: dict[str, Any]) -> None:
    request = StartConversationRequest.model_validate(copy.deepcopy(body))
    # Nothing the control plane sends may be dropped as unknown, but our budget.
    unknown = set(body) - {"max_budget_per_task"} - set(StartConversationRequest.model_fields)
    if unknown:
        raise ValueError(f"fields the SDK does not know: {sorted(unknown)}")
    if request.agent.llm.api_key is None:
        raise ValueError("the LLM key was lost")


def main() -> None:
    with open(sys.argv[1]) as handle:
        dump = json.load(handle)
    checked: Counter[str] = Counter()
    failures: list[str] = []
    check_events(dump["events"], checked, failures)
    checks = [
        ("ConversationInfo", check_info, dump["infos"]),
        ("StartConversationRequest", check_start_request, dump.get("start_requests", [])),
        (
            "ConversationStats",
            lambda s: ConversationStats.model_validate(copy.deepcopy(s)),
            dump.get("stats", []),
        ),
    ]
    for name, check, items in checks:
        for item in items:
            try:
                check(item)
                checked[name] += 1
            except Exception as exc:
                failures.append(f"{name}: {exc}")
    print(json.dumps({"checked": checked, "failures": failures}))


if __name__ == "__main__":
    main()
