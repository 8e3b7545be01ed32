"""The vLLM adapter's table of API shapes, checked against each release's
source (read with ast from its overlay, so no release is imported)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from harness.backends.vllm_api import SHAPES, VllmApi, api_for
from harness.core.vllm_releases import RELEASES, UnknownRelease, release_key
from harness.releases.vllm_overlay import ensure, overlay_path, read_info
from impl.profiles import (
    HiSparseLayoutStage,
    HiSparseResidency,
    StatsRecordedAt,
    TrailingDraftLayers,
    get_profile,
)

from .make_vars import make_words

# make test builds these (the Makefile's TEST_OVERLAYS, read from there); every
# other release is checked here once its overlay is built (make matrix builds
# them all), and is not listed at all until then, so nothing is skipped for
# want of a release.
ALWAYS = make_words("TEST_OVERLAYS")
CHECKED = tuple(r for r in RELEASES if r in ALWAYS or read_info(overlay_path(r)) is not None)


def test_every_followed_release_has_a_shape_and_others_are_refused():
    for release in RELEASES:
        assert api_for(release) in SHAPES
    major, minor, _ = release_key(RELEASES[-1])
    for outside in ("0.16.0", f"{major}.{minor + 1}.0"):
        with pytest.raises(UnknownRelease):
            api_for(outside)
    assert api_for("0.33.0").sizing_module == "vllm.v1.core.kv_cache_planning"
    assert api_for("0.32.0+cpu") is api_for("0.32.0")


@pytest.mark.parametrize("release", RELEASES)
def test_shapes_agree_with_the_profiles_fields_that_mirror_them(release):
    api, p = api_for(release), get_profile(release)
    assert api.block_sizes_rule == p.block_sizes_rule
    assert api.has_record_prefix_cache_stats == (
        p.stats_recorded_at is StatsRecordedAt.ADMISSION)
    assert api.admission_args == p.admission_controls.args
    assert api.manager_takes_watermark == ("has_scheduled_reqs" in p.admission_controls.args)
    assert api.takes_hash_lookahead_tokens == p.hash_lookahead_tokens
    assert api.lookup_takes_max_cache_hit_length == p.max_cache_hit_length
    assert api.has_connector_lookup == p.connector_lookup
    assert p.covers(release)
    assert api.has_hisparse == p.hisparse
    assert api.has_boundary_state_offloads == p.boundary_state_offloads.offers_keyed_states
    assert api.has_finalize_partial_tail_offloads == p.boundary_state_offloads.finalizes


def _functions(path: Path, cls: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
    return {}


def _fields_of_text(text: str, cls: str) -> list[str]:
    """The annotated fields a class of this source declares."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [n.target.id for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return []


def _fields(path: Path, cls: str) -> list[str]:
    return _fields_of_text(path.read_text(), cls)


def _params(f: ast.FunctionDef) -> list[str]:
    return [a.arg for a in f.args.args[1:] + f.args.kwonlyargs]


def source_mismatches(api: VllmApi, root: Path) -> list[str]:
    """The fields of `api` that the release's source at `root` contradicts."""
    core = root / "vllm" / "v1" / "core"
    manager = _functions(core / "kv_cache_manager.py", "KVCacheManager")
    init, alloc = _params(manager["__init__"]), _params(manager["allocate_slots"])
    lookup = _params(manager["get_computed_blocks"])
    returns = manager["get_computed_blocks"].returns
    arity = len(returns.slice.elts) if isinstance(returns, ast.Subscript) else None
    request = _params(_functions(root / "vllm" / "v1" / "request.py", "Request")["__init__"])
    sink = _params(_functions(core / "single_type_kv_cache_manager.py",
                              "SinkFullAttentionManager")["__init__"])
    coordinator_passes_zeroing = "needs_kv_cache_zeroing=" in (
        core / "kv_cache_coordinator.py").read_text()
    interface = (root / "vllm" / "v1" / "kv_cache_interface.py").read_text()
    attention_fields = _fields(root / "vllm" / "v1" / "kv_cache_interface.py", "AttentionSpec")
    reads_report_mode = '"kv_cache_report_mode"' in (root / "vllm" / "v1" / "request.py"
                                                     ).read_text()
    sizing = root / Path(*api.sizing_module.split(".")).with_suffix(".py")
    coordinator = (core / "kv_cache_coordinator.py").read_text()
    retention_from = ("kv_cache_config" if "prefix_cache_retention_interval" in interface
                      else "env" if "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in coordinator
                      else None)
    hisparse = root / "vllm" / "v1" / "hisparse" / "coordinator.py"
    hisparse_calls = _functions(hisparse, "HiSparseCoordinator") if hisparse.exists() else {}
    seen = {
        "manager_takes_scheduler_block_size": "scheduler_block_size" in init,
        "in_flight_tokens_arg": next((a for a in ("max_num_batched_tokens",
                                                   "max_in_flight_tokens") if a in init), None),
        "manager_takes_watermark": "watermark" in init,
        "admission_args": tuple(a for a in ("full_sequence_must_fit", "reserved_blocks",
                                            "has_scheduled_reqs") if a in alloc),
        "get_computed_blocks_arity": arity,
        "has_record_prefix_cache_stats": "record_prefix_cache_stats" in manager,
        "has_block_copies": "take_kv_cache_block_copies" in manager,
        "request_takes_session_id": "session_id" in request,
        "sink_manager_rejects_zeroing_arg": coordinator_passes_zeroing
        and "needs_kv_cache_zeroing" not in sink,
        "takes_hash_lookahead_tokens": "num_hash_lookahead_tokens" in init,
        "lookup_takes_max_cache_hit_length": "max_cache_hit_length" in lookup,
        "sizing_module": api.sizing_module if sizing.exists()
        and "\ndef get_kv_cache_groups(" in sizing.read_text() else None,
        "retention_interval_from": retention_from,
        "mamba_spec_takes_checkpoints": "num_prefill_checkpoint_blocks" in interface,
        "has_boundary_state_offloads": "take_boundary_state_offloads" in manager,
        "has_finalize_partial_tail_offloads": "finalize_partial_tail_offloads" in manager,
        "has_connector_lookup": "get_computed_blocks_for_connector" in manager
        and "truncate_computed_blocks" in manager,
        "shared_prefix_checkpoint_kwarg": next(
            (name for name in ("enable_mamba_shared_prefix_checkpoint",
                               "enable_mamba_fine_grained_prefix_cache") if name in init), None),
        "has_hisparse": "advance_scheduled" in hisparse_calls
        and "take_residency_updates" in hisparse_calls,
        "group_takes_is_eagle_group": "is_eagle_group" in _fields_of_text(
            interface, "KVCacheGroupSpec"),
        "manager_takes_num_prefill_lookahead": "num_prefill_lookahead" in init,
        "spec_takes_dcp_sharded": "dcp_sharded" in attention_fields,
        "request_reads_report_mode": reads_report_mode,
        "sizing_groups_model_first": any(
            f.exists() and "\ndef get_global_kv_cache_groups(" in f.read_text()
            for f in (core / "kv_cache_planning.py", core / "kv_cache_utils.py")),
    }
    return [f"{k}: table {getattr(api, k)!r}, source {v!r}" for k, v in seen.items()
            if getattr(api, k) != v]


def _source_root(release: str) -> Path:
    if release in ALWAYS:
        return ensure(release, progress=False).path
    return overlay_path(release)


@pytest.mark.parametrize("release", CHECKED)
def test_the_table_matches_each_releases_source(release):
    assert source_mismatches(api_for(release), _source_root(release)) == []


def test_a_wrong_row_is_caught():
    # Negative control: the checker must see a shape the source contradicts.
    root = _source_root("0.33.0")
    wrong = dataclasses.replace(api_for("0.33.0"), get_computed_blocks_arity=2,
                                sizing_module="vllm.v1.core.kv_cache_utils")
    found = source_mismatches(wrong, root)
    assert [m.split(":")[0] for m in found] == ["get_computed_blocks_arity", "sizing_module"]


def hisparse_residency_in_source(root: Path) -> HiSparseResidency | None:
    """The HiSparse shape a release's coordinator has (None: no HiSparse):
    whole table rows to the worker (0.30-0.31) or page-level updates."""
    path = root / "vllm" / "v1" / "hisparse" / "coordinator.py"
    calls = _functions(path, "HiSparseCoordinator") if path.exists() else {}
    if "take_block_table_updates" in calls:
        return HiSparseResidency.TABLE_ROWS
    if "take_residency_updates" in calls:
        return HiSparseResidency.OVERLAY
    return None


def _by_definitions(path: Path, rules):
    """The value of the first (function name, value) rule whose function the
    module at `path` defines at top level (None: none, or no such module)."""
    text = path.read_text() if path.exists() else ""
    return next((value for name, value in rules if f"\ndef {name}(" in text), None)


def hisparse_layout_stage_in_source(root: Path) -> HiSparseLayoutStage | None:
    """When a release's sizing derives HiSparse's groups (None: no HiSparse):
    grouping lays them out (0.31+) or only planning does (0.30, which sizes
    the groups in between with a memory reader of its own)."""
    return _by_definitions(root / "vllm" / "v1" / "hisparse" / "layout.py",
                           (("_lay_out_hisparse_groups", HiSparseLayoutStage.GROUPING),
                            ("get_hisparse_gpu_memory_usage", HiSparseLayoutStage.PLANNING)))


def trailing_draft_layers_in_source(root: Path) -> TrailingDraftLayers | None:
    """Which drafters a release's grouping finds by their last layer (None:
    no such rule, before draft groups and in 0.33, which reads specs'
    is_draft): DeepSeek V4 types on the packed path (0.29-0.30), or MTP too."""
    return _by_definitions(
        root / "vllm" / "v1" / "core" / "kv_cache_utils.py",
        (("_uses_trailing_mtp_layers", TrailingDraftLayers.MTP_OR_DEEPSEEK_V4),
         ("_is_deepseek_v4_eagle", TrailingDraftLayers.DEEPSEEK_V4_PACKED)))


# Profile fields read off each release's source, by their readers.
SOURCE_FIELDS = {"hisparse_residency": hisparse_residency_in_source,
                 "hisparse_layout_stage": hisparse_layout_stage_in_source,
                 "trailing_draft_layers": trailing_draft_layers_in_source}


@pytest.mark.parametrize("field", SOURCE_FIELDS)
@pytest.mark.parametrize("release", CHECKED)
def test_the_fields_read_off_the_source_match_each_release(release, field):
    found = SOURCE_FIELDS[field](_source_root(release))
    assert found in (None, getattr(get_profile(release), field))


def test_a_wrong_field_read_off_the_source_is_caught():
    # Negative control: 0.33's source is of neither older HiSparse shape
    # (table rows, groups derived when planned), 0.32's finds MTP drafters
    # by position, and 0.17's has none of the three.
    newest, oldest = _source_root("0.33.0"), _source_root("0.17.1")
    assert hisparse_residency_in_source(newest) is HiSparseResidency.OVERLAY
    assert hisparse_layout_stage_in_source(newest) is HiSparseLayoutStage.GROUPING
    assert trailing_draft_layers_in_source(_source_root("0.32.0")) is (
        TrailingDraftLayers.MTP_OR_DEEPSEEK_V4)
    assert [read(oldest) for read in SOURCE_FIELDS.values()] == [None, None, None]


def test_sizing_functions_are_found_where_each_release_keeps_them():
    import os
    import subprocess
    import sys

    probe = ("from harness.backends.vllm_backend import vllm_sizing\n"
             "from vllm.v1.core import kv_cache_utils\n"
             "m = vllm_sizing()\n"
             "print(m.__name__, hasattr(m, 'get_kv_cache_groups'),"
             " hasattr(kv_cache_utils, 'get_kv_cache_groups'))\n")
    seen = {}
    for release in ("0.32.0", "0.33.0"):
        env = {**os.environ, "PYTHONPATH": str(ensure(release, progress=False).path)}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, timeout=600)
        seen[release] = done.stdout.split()
    assert seen["0.32.0"] == ["vllm.v1.core.kv_cache_utils", "True", "True"]
    # 0.33 moved them without a re-export: kv_cache_utils no longer has them.
    assert seen["0.33.0"] == ["vllm.v1.core.kv_cache_planning", "True", "False"]
