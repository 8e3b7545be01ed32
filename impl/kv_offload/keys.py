"""Offload keys: a block hash followed by its KV cache group index as four
big-endian bytes (bytes, so a key is one cheap hashable object)."""

_GROUP_BYTES = 4


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    return bytes(block_hash) + group_idx.to_bytes(_GROUP_BYTES, "big", signed=False)


def key_block_hash(key: bytes) -> bytes:
    return key[:-_GROUP_BYTES]


def key_group_idx(key: bytes) -> int:
    return int.from_bytes(key[-_GROUP_BYTES:], "big", signed=False)
