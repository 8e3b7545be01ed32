"""The `anonymize` verb: a keyed, prefix-preserving remap of a trace's token
ids (harness/capture/anonymize.py), its hashes dropped or (--rehash) recorded
anew by the installed vLLM."""

from __future__ import annotations

import argparse
import os
import sys

from harness.backends.vllm_check import check_vllm
from harness.cli.support import print_error, print_outcome
from harness.core.exit_codes import ExitCode, fail


def register(sub) -> None:
    p = sub.add_parser(
        "anonymize", help="keyed, prefix-preserving remap of a trace's token ids",
        description="Rewrite token ids with a keyed bijection that keeps prefix sharing, "
        "block boundaries and hits (and replaces request ids, salts, LoRA and multimodal "
        "names). Token-dependent answers (block hashes, KV events) are dropped, or "
        "recorded anew from the installed vLLM with --rehash. The key comes from the "
        "environment: KVCONFORM_ANON_KEY=... kvconform anonymize IN --out OUT.jsonl")
    p.add_argument("input", metavar="IN")
    p.add_argument("--out", required=True, metavar="OUT", help="the anonymised trace (.jsonl)")
    # Discouraged (the secret shows in `ps` and shell history): KVCONFORM_ANON_KEY.
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, help="token ids stay below this (default: one past "
                   "the trace's largest)")
    p.add_argument("--rehash", action="store_true",
                   help="record hashes and KV events anew with the installed vLLM")
    p.set_defaults(func=_cmd_anonymize)


def _cmd_anonymize(args: argparse.Namespace) -> int:
    from harness.capture.anonymize import AnonymizeError, anonymize, resolve_key
    from harness.sources.replay import check_trace
    from harness.trace import TraceError

    if not args.out.endswith(".jsonl"):
        return fail(f"{args.out}: anonymised traces are written as .jsonl")
    if args.rehash and (code := check_vllm()) is not None:
        return code
    if args.key is not None:
        print("kvconform: --key puts the secret in `ps` and your shell history; set "
              "KVCONFORM_ANON_KEY instead", file=sys.stderr)
    try:
        key = resolve_key(args.key)
        target = args.out if not args.rehash else f"{args.out}.unhashed.jsonl"
        n = anonymize(args.input, target, key, args.vocab)
    except AnonymizeError as e:
        return fail(str(e))
    except TraceError as e:
        return print_error(e)
    if args.rehash:
        o = check_trace(target, ["vllm"], writer_path=args.out, explicit=True)
        os.remove(target)
        if o.error is not None or o.divergence is not None:
            return print_outcome(o)
    print(f"{args.out}: {n} events anonymised"
          + (" (hashes and KV events recorded anew by the installed vLLM)" if args.rehash
             else " (token-dependent answers dropped: see specs/CAPTURE.md)"))
    return ExitCode.OK
