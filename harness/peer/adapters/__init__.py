"""Adapters: vLLM's class and function names over impl's objects.

Each adapter holds an impl object and forwards to it; a method whose call
convention differs from impl's (a vLLM Request argument, a renamed keyword,
a different result shape) is translated here, and nothing else is done.
"""
