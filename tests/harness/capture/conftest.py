"""Helpers for the capture tests: the capture CLI, and small presets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.capture.presets import WORKLOADS_DIR

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "traces" / "golden"


def capture_cli(argv: list[str]) -> int:
    """`kvconform capture ...` as the console script runs it (usage errors
    raise SystemExit(2))."""
    from harness.cli.main import main

    return main(argv)


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
