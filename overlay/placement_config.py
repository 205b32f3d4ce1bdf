"""The operator's ``[placement]`` config section: what :func:`overlay.placement.place` runs with.

Strict like every Trellis config (an unknown key is an error naming it); errors name the file
and the field. Paths and client pairs are written ``"src -> dst"``::

    [placement]
    budget = 12
    max_per_path = 9
    once_per_node = false
    paths = ["b0 -> b4", "b0 -> b3"]     # default: the analytics job's demand classes
    windows = 3                          # the latest 3 analytics windows (default: all)

    [placement.clients]                  # where clients attach, for pair/publisher weights
    alice = "b0"
    bob = "b4"

    [placement.weights.paths]
    "b0 -> b3" = 2.0
    [placement.weights.pairs]
    "alice -> bob" = 5.0
    [placement.weights.publishers]
    alice = 1.5
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from overlay.placement import PathKey, path_weights
from security.errors import InvalidRequest

__all__ = [
    "PlacementConfig",
    "PlacementConfigError",
    "PlacementWeights",
    "load_placement_config",
    "parse_arrow",
]

Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class PlacementConfigError(InvalidRequest):
    """The ``[placement]`` section is missing, unreadable or invalid (the message says where)."""

    code = "placement_config"


def parse_arrow(text: str) -> PathKey:
    """``"b0 -> b3"`` as ``("b0", "b3")``.

    Raises:
        ValueError: not two non-empty ids around ``->``.
    """
    src, sep, dst = text.partition("->")
    src, dst = src.strip(), dst.strip()
    if not sep or not src or not dst or "->" in dst:
        raise ValueError(f"expected 'SRC -> DST', got {text!r}")
    return src, dst


def _arrow_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        for key in value:
            parse_arrow(str(key))
    return value


class PlacementWeights(BaseModel):
    """Operator weights ω (0 or more; 0 leaves a path out of the placement)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paths: dict[str, Weight] = Field(default_factory=dict)
    """``"src VN -> dst VN"`` → ω of that path."""
    pairs: dict[str, Weight] = Field(default_factory=dict)
    """``"publisher client -> subscriber client"`` → ω of the path between their VNs."""
    publishers: dict[str, Weight] = Field(default_factory=dict)
    """publisher client → ω of every path from its VN."""

    _check_paths = field_validator("paths", "pairs", mode="before")(_arrow_keys)


class PlacementConfig(BaseModel):
    """The ``[placement]`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: int | None = Field(default=None, ge=0)
    """Replicas to place; default: as many brokers as the overlay runs now."""
    max_per_path: int | None = Field(default=None, ge=0)
    """The most placed replicas the VNs of one path may hold together; default: no limit."""
    once_per_node: bool = False
    """Give a VN on several paths one batch only; the surplus goes to VNs with r < 3."""
    paths: list[str] | None = None
    """End-to-end paths ``"src -> dst"``; default: the analytics demand classes."""
    windows: int | None = Field(default=None, ge=1)
    """Use the latest N windows of the analytics output; default: all of them."""
    clients: dict[str, str] = Field(default_factory=dict)
    """client id → the VN it attaches to (needed by pair and publisher weights)."""
    weights: PlacementWeights = Field(default_factory=PlacementWeights)

    @field_validator("paths", mode="before")
    @classmethod
    def _check_path_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            for item in value:
                parse_arrow(str(item))
        return value

    @model_validator(mode="after")
    def _clients_are_placed(self) -> PlacementConfig:
        named = [c for k in self.weights.pairs for c in parse_arrow(k)]
        named += list(self.weights.publishers)
        missing = sorted({c for c in named if c not in self.clients})
        if missing:
            raise ValueError(
                f"weights name client(s) {', '.join(missing)} with no VN in placement.clients"
            )
        return self

    def path_keys(self) -> list[PathKey] | None:
        """The configured paths, or None when they come from the demand classes."""
        return None if self.paths is None else [parse_arrow(p) for p in self.paths]

    def omega(self, paths: list[PathKey]) -> dict[PathKey, float]:
        """ω of each path (see :func:`overlay.placement.path_weights`)."""
        w = self.weights
        return path_weights(
            paths,
            by_path={parse_arrow(k): v for k, v in w.paths.items()},
            by_pair={parse_arrow(k): v for k, v in w.pairs.items()},
            by_publisher=dict(w.publishers),
            client_vn=self.clients,
        )


def load_placement_config(path: str | Path | None) -> PlacementConfig:
    """The ``[placement]`` section of a TOML file (defaults when ``path`` is None).

    Raises:
        PlacementConfigError: no such file, not TOML, no ``[placement]`` section, or an invalid
            value; the message names the file and the field.
    """
    if path is None:
        return PlacementConfig()
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlacementConfigError(f"{source}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlacementConfigError(f"{source}: not valid TOML: {exc}") from None
    section = data.get("placement")
    if not isinstance(section, dict):
        raise PlacementConfigError(f"{source}: no [placement] section")
    try:
        return PlacementConfig.model_validate(section)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(["placement", *(str(p) for p in err["loc"])])
            msg = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{where}: {msg}")
        raise PlacementConfigError(f"{source}: " + "; ".join(problems)) from None
