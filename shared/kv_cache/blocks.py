"""Token-to-block arithmetic: the one place a token count becomes a block count (issue 29)."""


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """The blocks that hold `num_tokens` tokens, `block_size` to a block (the last one partly filled)."""
    return -(-num_tokens // block_size)
