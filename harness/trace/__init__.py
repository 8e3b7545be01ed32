"""Traces: the recorded calls of a scheduler on the KV cache manager, with the
answers vLLM gave (specs/trace.schema.json, specs/TRACE_FORMAT.md)."""

from harness.core.trace_error import TraceError
from harness.trace.codec import ModelShape, TraceHeader, TraceRecord
from harness.trace.reader import Trace, find_traces, open_trace
from harness.trace.writer import TraceWriter

__all__ = [
    "ModelShape", "Trace", "TraceError", "TraceHeader", "TraceRecord", "TraceWriter",
    "find_traces", "open_trace",
]
