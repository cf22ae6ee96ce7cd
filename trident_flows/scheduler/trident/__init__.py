"""The parts of the Trident policy, each owning its own state (``memory``: what one run keeps for the next)."""
