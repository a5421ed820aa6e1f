"""How many requests may be in flight: the control laws, the limiter that enforces them, their signals."""
