"""The OpenHands agent-server protocol (agent server 1.58), as the control plane speaks it to
the agent server in each sandbox, whichever kind it is (ours, agent/, or the official one):

- client.py         the HTTP calls (start a conversation, messages, confirmations, pause, run,
                    delete, bash) and the errors they raise
- start_request.py  the body of POST /api/conversations (the SDK's StartConversationRequest)
- kinds.py          the container environment each agent kind needs, and warming one up
- state.py          the execution status and the cost read from its events and ConversationInfo
- models.py         the protocol's execution status and metrics shapes

The agent server's announcement that it listens is a sandbox webhook
(controlplane/sandboxes/agent_webhooks.py), served with the event webhooks.
"""
