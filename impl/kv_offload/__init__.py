"""The CPU offload tier of vLLM's v1 KV cache (specs/KV_OFFLOAD.md): the
manager the OffloadingConnector's scheduler side calls, its chunk pool, the
store threshold, and the LRU and ARC replacement policies."""
