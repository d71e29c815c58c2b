"""greet: tiny greeting helpers (the idiom-check example's project)."""


def hello(name: str) -> str:
    """Return a greeting for ``name``."""
    return f"Hello, {name}!"
