"""`kvconform consumer-check`: a KV-event consumer (a router, a cache index)
checked against the engine (harness/consumer/)."""

from __future__ import annotations

import argparse
import sys

from harness.core.exit_codes import ExitCode


def register(sub) -> None:
    p = sub.add_parser("consumer-check", help="check a KV-event consumer against the engine",
                       description="Run TRACE on impl, publish its KV events over ZMQ on "
                       "127.0.0.1 exactly as the trace's vLLM release's ZmqEventPublisher "
                       "does (topic, sequence numbers, msgpack payload, replay socket), and "
                       "after each batch ask the consumer CMD (JSON lines on its stdin/stdout, "
                       "specs/FOREIGN_BACKEND.md) which prefix of each request's tokens it "
                       "believes cached, per group, and where. Exit 0 when it always agrees "
                       "with the engine, 1 at the first disagreement (named at the step), 2 "
                       "bad input or a consumer that breaks the protocol, 3 one that crashes "
                       "or hangs.")
    p.add_argument("--cmd", required=True, metavar="CMD", help="the consumer's command line")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--page", metavar="DIR",
                   help="also write a result page (index.md, index.html) here")
    p.set_defaults(func=_cmd_consumer_check)


def _cmd_consumer_check(args: argparse.Namespace) -> int:
    from harness.consumer.check import check_consumer

    r = check_consumer(args.cmd, args.trace)
    print(r.message, file=sys.stdout if r.exit_code in (ExitCode.OK, ExitCode.DIVERGED)
          else sys.stderr)
    if args.page:
        from harness.report.results import ResultRow, write_result_page

        write_result_page(args.page, f"KV-event consumer: {args.cmd}",
                          [ResultRow(args.trace, "consumer-check", r.exit_code, r.message)])
    return r.exit_code
