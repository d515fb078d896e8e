"""The reference queue manager. `core` is the pure scheduling core shared with the simulator."""
