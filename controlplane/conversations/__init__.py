"""App conversations: start tasks, conversation records, and the agent server they run on."""
