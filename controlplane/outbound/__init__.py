"""Where the control plane may connect when it connects for someone else: the one outbound
policy of every connection opened on a user's behalf (the LLM gateway, directly and through its
LiteLLM translator) or to an operator's URL (lifecycle webhooks). docs/security.md,
"Outbound connections".

policy.py says which addresses are refused and why; client.py makes the aiohttp sessions that
connect only where it allows (no redirects, the address checked is the address connected to);
event_loop.py holds a whole process to it (the translator, whose LiteLLM makes connections of
its own); sources.py keeps the policy's inputs current (the driver's sandbox networks, Redis and
its Sentinels, the other replicas, the operator's allow-list)."""
