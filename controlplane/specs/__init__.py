"""Sandbox spec templates (specs/*.yaml), validated at start-up."""
