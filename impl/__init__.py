"""Clean-room implementation of vLLM's v1 KV-cache stack.

Nothing in this package imports vllm (or the harness): it is the implementation
under test, written from vLLM's documented and observed behaviour.
"""
