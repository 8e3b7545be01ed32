"""Helpers for the capture tests: the capture CLI, and small presets."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from harness.capture.presets import WORKLOADS_DIR

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "traces" / "golden"


def capture_cli(argv: list[str]) -> int:
    """`kvconform capture/anonymize ...` as harness/cli.py runs it (its parser
    exits 2 on usage errors)."""
    from harness.capture.cli import register

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise SystemExit(2)

    parser = Parser(prog="kvconform")
    register(parser.add_subparsers(dest="verb", required=True, parser_class=Parser))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def small_preset(tmp_path):
    """small_preset(name, **section overrides) -> path of a shrunk copy."""

    def make(name: str, **overrides) -> str:
        doc = yaml.safe_load((WORKLOADS_DIR / f"{name}.workload").read_text())
        for section, values in overrides.items():
            if isinstance(values, dict):
                doc.setdefault(section, {}).update(values)
            else:
                doc[section] = values
        path = tmp_path / f"{name}.workload"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    return make
