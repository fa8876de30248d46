"""The audit store: what ran, under which rules, and what was refused (docs/audit.md)."""
