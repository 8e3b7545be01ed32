"""What the manager knows of a request: its id, where each of its keys ends in
its token sequence (when the scheduler recorded it), and a scratch slot per
value type where a manager keeps its per-request record."""

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class RequestContext:
    req_id: str = ""
    kv_transfer_params: dict | None = None
    scratch: dict[type, Any] = field(default_factory=dict)
    positions: dict[bytes, int] = field(default_factory=dict)

    def set_state(self, value: Any) -> None:
        self.scratch[type(value)] = value

    def get_state(self, cls: type) -> Any:
        return self.scratch.get(cls)

    def set_offload_key_position(self, key: bytes, end_token: int) -> None:
        self.positions[key] = end_token

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self.positions.get(key)
