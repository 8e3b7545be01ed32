"""A Hugging Face hub cache holding only the hand-written config.json files
of model_configs/, for the vLLM tests that build a ModelConfig by model name.

With HF_HOME pointing here and HF_HUB_OFFLINE=1, `ModelConfig(model="Qwen/...")`
reads the config from this cache and never reaches a hub. Folder names are
the model ids with "/" as "--" (the hub cache's own convention).
"""

from __future__ import annotations

import shutil
from pathlib import Path

MODEL_CONFIGS = Path(__file__).parent / "model_configs"
_REVISION = "0" * 40


def build(hf_home: Path) -> dict[str, str]:
    """Lay the configs out as a hub cache under hf_home; returns the
    environment variables that make vLLM read it."""
    hub = hf_home / "hub"
    for folder in MODEL_CONFIGS.iterdir():
        if not folder.is_dir():
            continue
        repo = hub / f"models--{folder.name}"
        snapshot = repo / "snapshots" / _REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(_REVISION)
        for f in folder.iterdir():
            shutil.copy(f, snapshot / f.name)
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
