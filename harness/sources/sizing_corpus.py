"""The corpus of model shapes (traces/sizing/*.yaml, format kvconform-sizing/1;
specs/SIZING.md): each file a list of shapes, each shape a case of the gate.

    format: kvconform-sizing/1
    shapes:
      - name: gemma-like
        layers:
          pattern: [window, window, full]   # layer i is pattern[i % len]
          repeat: 4                         # 12 layers
          kinds:
            window: {kind: sliding_window, block_size: 16, num_kv_heads: 8,
                     head_size: 128, dtype: bfloat16, sliding_window: 1024}
            full: {kind: full_attention, block_size: 16, num_kv_heads: 8, head_size: 128}
        workers:                            # default: one worker with every layer
          - {layers: [0, 6], memory: 1GiB}  # layers 0-5
          - {layers: [6, 12], memory_blocks: 33, memory_extra: -1}
        engine: {max_model_len: 8192, auto_fit: true}
        expect: {scheduler.num_blocks: 33}

Layer i is named `model.layers.{i}.{label}`. Bad input is a TraceError,
`file:line: field: message` (exit 2).
"""

from __future__ import annotations

import dataclasses
import re

from harness.core import kinds
from harness.core.sizing_shape import (
    DTYPE_SIZES,
    LAYOUTS,
    SIZING_FORMAT,
    LayerShape,
    SizingShape,
    WorkerShape,
    is_sizing_corpus,
)
from harness.core.trace_error import TraceError

FORMAT = SIZING_FORMAT
_SHAPE_KEYS = {"name", "note", "layers", "workers", "engine", "expect"}
_LAYER_KEYS = {"kind", "block_size", "num_kv_heads", "head_size", "dtype", "dtypes"}
_WORKER_KEYS = {"layers", "memory", "memory_blocks", "memory_extra"}
_ENGINE_KEYS = {f.name: f for f in dataclasses.fields(SizingShape)
                if f.name not in ("name", "layers", "workers", "where", "expect")}
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


__all__ = ["FORMAT", "is_sizing_corpus", "read_sizing_corpus", "shape_document"]


class _Doc:
    """A YAML document as plain data, with the line of every node by path."""

    def __init__(self, path: str, text: str) -> None:
        import yaml

        self.path = path
        self.lines: dict[str, int] = {}
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise TraceError(path, mark.line + 1 if mark else 1, "(yaml)",
                             str(getattr(e, "problem", e))) from None
        if node is not None:
            self._index(node, "")

    def _index(self, node, path: str) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node.value, list):
            for i, item in enumerate(node.value):
                if isinstance(item, tuple):
                    key, value = item
                    sub = f"{path}.{key.value}" if path else str(key.value)
                    self.lines[sub] = key.start_mark.line + 1
                    self._index(value, sub)
                    self.lines[sub] = key.start_mark.line + 1
                else:
                    self._index(item, f"{path}[{i}]")

    def error(self, path: str, message: str) -> TraceError:
        probe = path
        while probe and probe not in self.lines:
            probe = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
        return TraceError(self.path, self.lines.get(probe, 1), path or "(file)", message)


def _int(doc: _Doc, path: str, value, low: int | None = 1) -> int:
    if type(value) is not int or (low is not None and value < low):
        raise doc.error(path, f"must be an integer{f' >= {low}' if low is not None else ''}, "
                              f"not {value!r}")
    return value


def _mapping(doc: _Doc, path: str, value, allowed: set[str] | None = None) -> dict:
    if not isinstance(value, dict):
        raise doc.error(path, "must be a mapping")
    if allowed is not None:
        for key in value:
            if key not in allowed:
                raise doc.error(f"{path}.{key}", f"unknown field (known: "
                                                 f"{', '.join(sorted(allowed))})")
    return value


def _bytes(doc: _Doc, path: str, value) -> int:
    if type(value) is int and value >= 0:
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]iB|B)?\s*", str(value))
    if m is None:
        raise doc.error(path, f"a number of bytes (e.g. 3GiB, 512MiB, 1000), not {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def _layer(doc: _Doc, path: str, spec) -> LayerShape:
    spec = _mapping(doc, path, spec)
    kind = spec.get("kind", "full_attention")
    try:
        row = kinds.kind_row(kind)
    except ValueError as e:
        raise doc.error(f"{path}.kind", str(e)) from None
    own = {f.name for f in dataclasses.fields(row.impl_spec)} - {"dtype_size", "dtype_sizes",
                                                                  "dtype_label"}
    values = {}
    for key, value in spec.items():
        if key in _LAYER_KEYS:
            continue
        if key not in own:
            raise doc.error(f"{path}.{key}", f"not a field of a {kind} layer "
                                             f"({row.impl_spec.__name__})")
        values[key] = tuple(tuple(s) for s in value) if key == "shapes" else value
    for name in row.fields:
        if name not in values:
            raise doc.error(path, f"a {kind} layer needs {name}")
    dtypes = tuple(spec.get("dtypes", ()))
    for i, d in enumerate((spec.get("dtype", "bfloat16"), *dtypes)):
        if d not in DTYPE_SIZES:
            where = f"{path}.dtype" if i == 0 else f"{path}.dtypes[{i - 1}]"
            raise doc.error(where, f"unknown dtype {d!r} (known: {', '.join(DTYPE_SIZES)})")
    if kind == "mamba" and len(dtypes) != len(values.get("shapes", ())):
        raise doc.error(path, "a mamba layer needs one of dtypes per state tensor of shapes")
    return LayerShape(kind, _int(doc, f"{path}.block_size", spec.get("block_size")),
                      _int(doc, f"{path}.num_kv_heads", spec.get("num_kv_heads", 1)),
                      _int(doc, f"{path}.head_size", spec.get("head_size", 64)),
                      spec.get("dtype", "bfloat16"), dtypes, tuple(sorted(values.items())))


def _layers(doc: _Doc, path: str, spec) -> tuple[tuple[str, LayerShape], ...]:
    spec = _mapping(doc, path, spec, {"pattern", "repeat", "kinds"})
    kinds_of = _mapping(doc, f"{path}.kinds", spec.get("kinds"))
    shapes = {label: _layer(doc, f"{path}.kinds.{label}", s) for label, s in kinds_of.items()}
    pattern = spec.get("pattern", list(kinds_of))
    if not isinstance(pattern, list) or not pattern:
        raise doc.error(f"{path}.pattern", "must be a list of the labels of kinds")
    for i, label in enumerate(pattern):
        if label not in shapes:
            raise doc.error(f"{path}.pattern[{i}]", f"no kind labelled {label!r}")
    repeat = _int(doc, f"{path}.repeat", spec.get("repeat", 1))
    labels = pattern * repeat
    return tuple((f"model.layers.{i}.{label}", shapes[label]) for i, label in enumerate(labels))


def _workers(doc: _Doc, path: str, spec, names: tuple[str, ...]) -> tuple[WorkerShape, ...]:
    spec = spec if spec is not None else [{"memory": "1GiB"}]
    if not isinstance(spec, list) or not spec:
        raise doc.error(path, "must be a list of workers")
    out = []
    for i, w in enumerate(spec):
        where = f"{path}[{i}]"
        w = _mapping(doc, where, w, _WORKER_KEYS)
        span = w.get("layers", [0, len(names)])
        if (not isinstance(span, list) or len(span) != 2 or any(type(x) is not int for x in span)
                or not 0 <= span[0] <= span[1] <= len(names)):
            raise doc.error(f"{where}.layers", f"a range [first, end) of layer indices in "
                                               f"[0, {len(names)}], not {span!r}")
        if ("memory" in w) == ("memory_blocks" in w):
            raise doc.error(where, "give memory (bytes) or memory_blocks, one of them")
        out.append(WorkerShape(
            names[span[0]:span[1]],
            _bytes(doc, f"{where}.memory", w["memory"]) if "memory" in w else None,
            _int(doc, f"{where}.memory_blocks", w["memory_blocks"], 0)
            if "memory_blocks" in w else None,
            _int(doc, f"{where}.memory_extra", w.get("memory_extra", 0), None)))
    return tuple(out)


def _engine(doc: _Doc, path: str, spec) -> dict:
    spec = _mapping(doc, path, spec or {}, set(_ENGINE_KEYS))
    out = {}
    for key, value in spec.items():
        default = _ENGINE_KEYS[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise doc.error(f"{path}.{key}", f"must be true or false, not {value!r}")
        elif key == "kv_cache_layout":
            if value not in LAYOUTS:
                raise doc.error(f"{path}.{key}", f"one of {', '.join(LAYOUTS)}, not {value!r}")
        elif key == "mamba_cache_mode":
            if value not in ("none", "align"):
                raise doc.error(f"{path}.{key}", f"none or align, not {value!r}")
        elif value is not None or default is not None:
            _int(doc, f"{path}.{key}", value, 0)
        out[key] = value
    return out


def read_sizing_corpus(path: str) -> list[SizingShape]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(path, 1, "(file)", f"cannot read it: {e}") from None
    doc = _Doc(path, text)
    top = _mapping(doc, "", doc.data, {"format", "description", "shapes"})
    if top.get("format") != FORMAT:
        raise doc.error("format", f"must be {FORMAT}")
    if not isinstance(top.get("shapes"), list):
        raise doc.error("shapes", "must be a list of shapes")
    shapes, seen = [], set()
    for i, spec in enumerate(top["shapes"]):
        where = f"shapes[{i}]"
        spec = _mapping(doc, where, spec, _SHAPE_KEYS)
        name = spec.get("name")
        if not isinstance(name, str) or not name or name in seen:
            raise doc.error(f"{where}.name", "every shape needs a name of its own")
        seen.add(name)
        layers = _layers(doc, f"{where}.layers", spec.get("layers"))
        workers = _workers(doc, f"{where}.workers", spec.get("workers"),
                           tuple(n for n, _ in layers))
        expect = tuple(_mapping(doc, f"{where}.expect", spec.get("expect") or {}).items())
        shapes.append(SizingShape(name, layers, workers,
                                  where=f"{path}:{doc.lines.get(where, 1)}", expect=expect,
                                  **_engine(doc, f"{where}.engine", spec.get("engine"))))
    return shapes


# -- writing --------------------------------------------------------------------------


def _layer_document(layer: LayerShape) -> dict:
    out: dict = {"kind": layer.kind, "block_size": layer.block_size}
    if layer.kind == "mamba":
        out["dtypes"] = list(layer.dtypes)
    else:
        out.update(num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
                   dtype=layer.dtype)
    for key, value in layer.values:
        out[key] = [list(s) for s in value] if key == "shapes" else value
    return out


def _labels(shape: SizingShape) -> dict[LayerShape, str]:
    """A label per distinct layer: the one its names carry where they carry
    one consistently (model.layers.{i}.{label}), else k0, k1, ..."""
    by_name: dict[LayerShape, str] = {}
    for i, (name, layer) in enumerate(shape.layers):
        label = name.removeprefix(f"model.layers.{i}.")
        if label == name or by_name.setdefault(layer, label) != label:
            by_name = {}
            break
    if len(set(by_name.values())) == len(by_name) and by_name:
        return by_name
    labels: dict[LayerShape, str] = {}
    for _, layer in shape.layers:
        labels.setdefault(layer, f"k{len(labels)}")
    return labels


def shape_document(shapes: list[SizingShape]) -> dict:
    """Shapes as a sizing corpus (what read_sizing_corpus reads back: each
    layer labelled by its distinct spec, one pattern entry per layer)."""
    out = []
    for shape in shapes:
        labels = _labels(shape)
        index = {name: i for i, (name, _) in enumerate(shape.layers)}
        workers = []
        for w in shape.workers:
            first = index[w.layers[0]] if w.layers else 0
            doc: dict = {"layers": [first, first + len(w.layers)]}
            if w.memory is not None:
                doc["memory"] = w.memory
            else:
                doc.update(memory_blocks=w.memory_blocks, memory_extra=w.memory_extra)
            workers.append(doc)
        engine = {f.name: getattr(shape, f.name) for f in dataclasses.fields(SizingShape)
                  if f.name in _ENGINE_KEYS and getattr(shape, f.name) != f.default}
        out.append({"name": shape.name,
                    "layers": {"pattern": [labels[layer] for _, layer in shape.layers],
                               "kinds": {v: _layer_document(k) for k, v in labels.items()}},
                    "workers": workers, "engine": engine})
    return {"format": FORMAT, "shapes": out}
