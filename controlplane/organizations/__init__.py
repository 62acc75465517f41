"""The one organization of a deployment, as OpenHands Cloud clients (Agent Canvas) read it."""
