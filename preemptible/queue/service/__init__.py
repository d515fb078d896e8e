"""The reference queue manager: `preemptible queue serve` (docs/queue-manager.md)."""
