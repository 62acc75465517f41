"""What the OpenHands web frontend reads before anything else: its configuration and the option
lists of its settings screens."""
