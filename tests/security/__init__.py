"""Attacks on the control plane, each from where its attacker is (docs/security.md)."""
