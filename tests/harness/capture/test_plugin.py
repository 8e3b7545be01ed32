"""The vLLM plugin: enabled by an environment variable, loaded by vLLM itself in
an unmodified vLLM program (the tiny engine, its engine core in its own
process); what it records in rotating parts joins into a trace that replays
conformant on impl."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture.segments import sessions
from harness.capture.tiny_model import TinyModel
from harness.sources.replay import check_trace

from .conftest import capture_cli

pytestmark = pytest.mark.vllm

# A plain vLLM program: nothing of kvconform in it.
PROGRAM = """
import sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, dtype="bfloat16", block_size=32, num_gpu_blocks_override=24,
              max_model_len=640, max_num_seqs=4, max_num_batched_tokens=256,
              enable_prefix_caching=True, seed=0)
    system = list(range(100, 180))
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0)
    for turn in range(3):
        prompts = [TokensPrompt(prompt_token_ids=system + [turn, i] * (5 + i))
                   for i in range(6)]
        llm.generate(prompts, params, use_tqdm=False)
    # Time for the engine core to close its last part on a loaded machine
    # (vLLM's default: SIGKILL after 5 s).
    llm.llm_engine.engine_core.shutdown(timeout=600)
    print("done")
"""


def test_the_plugin_records_an_unmodified_vllm_program(tmp_path, capsys):
    from importlib.metadata import entry_points

    assert any(ep.value == "harness.capture.plugin:register"
               for ep in entry_points(group="vllm.general_plugins")), \
        "the entry point is not registered: pip install --no-deps -e ."
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    model = TinyModel().write(str(tmp_path / "model"))
    env = dict(os.environ, KVCONFORM_CAPTURE_DIR=str(tmp_path / "capture"),
               KVCONFORM_CAPTURE_MAX_EVENTS="100", KVCONFORM_CAPTURE_FREE_QUEUE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="1", HF_HUB_OFFLINE="1", PYTHONHASHSEED="0",
               VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1",
               VLLM_RPC_BASE_PATH=str(tmp_path))  # the engine core's sockets
    # A limit for a hung program only: a loaded 2-core machine takes minutes.
    proc = subprocess.run([sys.executable, str(script), model], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    (session,) = sessions(str(tmp_path / "capture"))
    parts = sorted(p.name for p in Path(session).iterdir())
    assert len(parts) > 3 and all(p.endswith(".kvpart") for p in parts)  # rotated, closed

    out = tmp_path / "server.jsonl"
    assert capture_cli(["capture", "join", str(tmp_path / "capture"), "--out", str(out),
                        "--check"]) == 0
    assert "conformant" in capsys.readouterr().out
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0 and o.num_events > 300
    text = out.read_text()
    assert '"source":"production"' in text.splitlines()[0]
    # Turns 2 and 3 hit the system prompt cached by turn 1.
    assert '"hit_tokens":64' in text


def test_without_the_variable_the_plugin_does_nothing(monkeypatch):
    from harness.capture import plugin

    monkeypatch.delenv(plugin.ENV_DIR, raising=False)
    from vllm.v1.core.sched.scheduler import Scheduler

    before = Scheduler.__init__
    plugin.register()
    assert Scheduler.__init__ is before
