"""The reference queue manager: `preemptible queue serve` (docs/user-guide/queue-manager.md)."""
