"""Replacement policies of the CPU offload tier: which chunk to drop."""
