"""How an adapter says "impl cannot answer this": a named feature impl lacks.

`ImplLacks` is raised where a vLLM input (a spec field, a constructor flag, a
method) has no counterpart in impl, so the test fails with the feature's
name instead of an unrelated error. Every raise is also remembered for the
running test (`take_seen`), so a test that swallows the exception is still
classified by it.

`NotFromImpl` stands for a value vLLM returns that impl does not compute
(e.g. the third value of vLLM's get_computed_blocks): unpacking it is fine,
any use of it raises ImplLacks.
"""

from __future__ import annotations

_seen: list[tuple[str, str]] = []


class ImplLacks(Exception):
    """impl has no counterpart for a vLLM feature a test uses."""

    def __init__(self, feature: str, detail: str = "") -> None:
        self.feature = feature
        self.detail = detail
        _seen.append((feature, detail))
        super().__init__(f"impl lacks {feature}" + (f": {detail}" if detail else ""))


class MissingImplAPI(ImplLacks, AttributeError):
    """A public name vLLM's tests use that impl's object does not have."""

    def __init__(self, owner: str, name: str) -> None:
        ImplLacks.__init__(self, "API", f"{owner}.{name}")
        self.owner = owner
        self.name = name


def take_seen() -> list[tuple[str, str]]:
    seen = list(_seen)
    _seen.clear()
    return seen


def require(condition: bool, feature: str, detail: str = "") -> None:
    """Raise ImplLacks(feature) unless `condition` (an input impl can take)."""
    if not condition:
        raise ImplLacks(feature, detail)


class Checks:
    """Run every check of an input before refusing it, so a test's record
    names every feature its input needs (each ImplLacks is remembered), not
    only the first; the first is raised at the end."""

    def __init__(self) -> None:
        self.first: ImplLacks | None = None

    def __enter__(self) -> Checks:
        return self

    def run(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ImplLacks as e:
            self.first = self.first or e
            return None

    def require(self, condition: bool, feature: str, detail: str = "") -> None:
        self.run(require, condition, feature, detail)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.first is not None:
            raise self.first


class NotFromImpl:
    """A result vLLM returns and impl does not compute; using it raises."""

    __slots__ = ("what", "feature")

    def __init__(self, what: str, feature: str) -> None:
        self.what = what
        self.feature = feature

    def _use(self, *_args):
        raise ImplLacks(self.feature, f"the test reads {self.what}")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _use
    __int__ = __index__ = __float__ = __bool__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _use
    __floordiv__ = __mod__ = __iter__ = __len__ = __getitem__ = _use
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self.what}: not computed by impl>"
