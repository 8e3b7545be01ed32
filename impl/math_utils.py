"""Token and block arithmetic shared across impl."""


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b: the blocks that hold a tokens of b each."""
    return -(-a // b)
