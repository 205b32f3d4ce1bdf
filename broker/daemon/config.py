"""Broker configuration: one TOML file, validated strictly, overridable from the environment.

Precedence (later wins): defaults < config file < ``TRELLIS_<FIELD>`` environment variables
(JSON for a list or a table; ``TRELLIS_<TABLE>_<KEY>`` for one key of a table) < command-line
shortcuts. A typo in the file is an error naming the key and the file, never silently ignored
(``extra="forbid"``). Relative paths in the file are relative to the file's directory; the
files a broker reads at start (manifest, key, TLS, trusted TDNs) are checked when the config loads.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from broker.daemon.hops import VOTE_BUDGET
from broker.errors import TrellisError
from broker.wire.protocol import DEFAULT_MAX_FRAME, MAX_VN_SIZE
from overlay.manifest import Manifest
from security.agreement import COPY_BUDGET
from security.envelope import private_key_from_bytes
from security.topics_identity import load_trusted_tdns
from security.waiting import WAITING_BUDGET

ENV_PREFIX = "TRELLIS_"


class ConfigError(TrellisError):
    """The configuration is invalid; the message names the field and the file."""

    code = "config"


def _port_in_range(value: str) -> str:
    port = int(value.rpartition(":")[2])
    if not 1 <= port <= 65535:
        raise ValueError(f"{value!r}: port {port} is not 1 to 65535")
    return value


Endpoint = Annotated[
    str,
    Field(pattern=r"^[^\s:]+:\d{1,5}$", description="HOST:PORT"),
    AfterValidator(_port_in_range),
]


class NeighbourConfig(BaseModel):
    """An overlay neighbour: its broker id and where it listens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=256)
    endpoint: Endpoint
    vn: str | None = Field(None, description="its virtual node (default: its own id)")
    replica: int = Field(0, ge=0, description="its index among its VN's replicas")
    vn_size: int = Field(1, ge=1, le=MAX_VN_SIZE, description="number of replicas of its VN")

    @model_validator(mode="after")
    def _replica_in_vn(self) -> NeighbourConfig:
        if self.replica >= self.vn_size:
            raise ValueError(
                f"neighbour {self.id!r}: replica = {self.replica} with vn_size = "
                f"{self.vn_size}: a VN's replicas are numbered 0 to vn_size - 1"
            )
        return self

    @property
    def vn_id(self) -> str:
        return self.vn or self.id


class ReconfigConfig(BaseModel):
    """Live OCBR reconfiguration (SPEC §5): when this broker acts as master, and how it plans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="act as master every interval and accept plans")
    interval: float = Field(10.0, gt=0, description="Δt: seconds between master turns")
    jitter: float = Field(
        0.25, ge=0, lt=1, description="each turn fires at interval × (1 ± jitter), at random"
    )
    min_traffic: int = Field(
        20, ge=1, description="publications observed since the last change before planning"
    )
    candidates: int = Field(8, ge=1, description="N: candidate moves priced per tabu iteration")
    iterations: int = Field(30, ge=0, description="n: tabu iterations per search")
    tenure: int = Field(3, ge=0, description="iterations a moved link stays tabu")
    alpha: float = Field(1.0, ge=0, description="α: weight of link cost")
    beta: float = Field(1.0, ge=0, description="β: weight of broker cost")
    link_cost: float = Field(1.0, ge=0, description="C_l of every link")
    broker_cost: float = Field(1.0, ge=0, description="C_b of every broker")
    lock_lease: float = Field(
        5.0, gt=0, description="seconds a neighbourhood lock holds without news from its master"
    )
    step_timeout: float = Field(
        3.0, gt=0, description="seconds one protocol step may take before the round aborts"
    )
    repair_interval: float = Field(
        30.0,
        gt=0,
        description="seconds between checks that this replica keeps the neighbour VNs and "
        "tables f + 1 of its siblings keep (taken if not: it missed a round)",
    )


class TrafficLogConfig(BaseModel):
    """Traffic logs for the analytics job (SPEC §7): where, how often, how much to keep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="write traffic logs (when a directory is known)")
    dir: Path | None = Field(
        None,
        description="where the logs go (a subdirectory per broker); default: 'traffic' beside "
        "links_file, and no logging when neither is set",
    )
    flush_interval: float = Field(
        0.5, gt=0, le=60, description="seconds between batched writes (what a crash may lose)"
    )
    rotate_seconds: float = Field(300.0, gt=0, description="start a new file after this long")
    rotate_bytes: int = Field(
        64 * 1024 * 1024, ge=4096, description="start a new file past this size"
    )
    retention_bytes: int = Field(
        1024 * 1024 * 1024, ge=4096, description="delete the oldest files past this total"
    )
    retention_seconds: float = Field(
        7 * 24 * 3600.0, gt=0, description="delete files older than this"
    )


ByzantineMode = Literal[
    "drop",
    "corrupt",
    "equivocate",
    "collude",
    "delay",
    "replay",
    "reorder",
    "stall",
    "misplan",
    "mistable",
    "goes-back",
    "slow-install",
]
"""Fault injection for tests and demos (a broker's ``byzantine`` setting, but ``none``)."""
BYZANTINE_MODES: tuple[str, ...] = get_args(ByzantineMode)


class BrokerConfig(BaseModel):
    """Everything a broker daemon needs to start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field("broker-1", min_length=1, max_length=256, description="unique broker id")
    host: str = Field("127.0.0.1", description="address to listen on for clients and brokers")
    port: int = Field(7700, ge=0, le=65535, description="TCP port; 0 picks a free one")
    admin_port: int | None = Field(
        None, ge=0, le=65535, description="HTTP port for /metrics and /healthz; 0 picks one"
    )
    max_frame: int = Field(
        DEFAULT_MAX_FRAME, ge=1024, le=64 * 1024 * 1024, description="largest frame accepted"
    )
    send_buffer_limit: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        description="bytes queued to one connection before deliveries to it are dropped",
    )
    slow_consumer: Literal["drop", "disconnect"] = Field(
        "drop",
        description="what happens to a client whose send buffer is over send_buffer_limit: "
        "its deliveries are dropped and counted (NOTICE dropped once it drains), or it is "
        "closed with ERROR slow_consumer",
    )
    max_subscriptions_per_client: int = Field(
        10_000,
        ge=1,
        description="subscriptions one client connection may hold; past it SUBSCRIBE gets "
        "ERROR limit_exceeded (the connection stays open)",
    )
    max_advertisements_per_client: int = Field(
        10_000,
        ge=1,
        description="advertisements one client connection may hold; past it ADVERTISE gets "
        "ERROR limit_exceeded (the connection stays open)",
    )
    max_filter_bytes_per_client: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="bytes of filters (wire form) one client connection's advertisements and "
        "subscriptions may hold together; past it ADVERTISE or SUBSCRIBE gets ERROR "
        "limit_exceeded (the connection stays open)",
    )
    max_waiting_share_bytes: int = Field(
        WAITING_BUDGET,
        ge=64 * 1024,
        description="bytes of key shares from one sender (a client's root splits, an upstream "
        "replica's) that may wait at this broker for their publication or for a path a "
        "majority vouches for; past it that sender's further shares are dropped and counted "
        "(trellis_shares_over_budget_total), so a flood fills its own allowance only",
    )
    session_linger: float = Field(
        10.0,
        ge=0,
        description="seconds a client session outlives a connection lost without a clean "
        "close (reset, heartbeat timeout): its subscriptions stay routed and what it is sent "
        "is buffered for the same client reconnecting; 0: a session ends with its connection",
    )
    session_buffer: int = Field(
        8 * 1024 * 1024,
        ge=0,
        description="bytes buffered at most for one parked session; past it the session ends",
    )
    max_publishers: int = Field(
        65536,
        ge=16,
        description="publishers whose routed seqs and copy agreement a broker remembers; "
        "past it, the idle ones heard from least recently are forgotten (memory stays "
        "bounded however many short-lived publishers pass through)",
    )
    max_copy_bytes_per_source: int = Field(
        COPY_BUDGET,
        ge=1024 * 1024,
        description="bytes of publication copies one upstream replica may have here "
        "undecided (fewer than f + 1 identical copies yet), over all publishers; past it its "
        "new copies are refused and it is blamed as flooding: lone copies for publishers "
        "nobody else sends are never decided, so without it they held memory without bound",
    )
    max_vote_bytes_per_source: int = Field(
        VOTE_BUDGET,
        ge=1024 * 1024,
        description="bytes of routing entries (key and filter) one replica of a neighbour "
        "VN may have announced here that no majority of its VN sent yet; past it its new "
        "ones are refused with limit_exceeded: an entry no majority sends is never applied, "
        "so without it a replica announcing new ones without end held memory without bound",
    )
    copy_patience: float = Field(
        1.0,
        gt=0,
        description="seconds a publication fewer than f + 1 upstream replicas sent may hold "
        "back later ones they agreed on before it is abandoned",
    )
    silence_deadline: float = Field(
        2.0,
        gt=0,
        description="an upstream replica that sent no copy this long after its VN agreed on "
        "a publication is blamed as silent",
    )
    routing_wave_timeout: float = Field(
        3.0,
        gt=0,
        description="seconds a broker waits for a neighbour to confirm that routing state "
        "is in force before acknowledging an ADVERTISE or SUBSCRIBE without it",
    )
    read_slice: float = Field(
        0.005,
        gt=0,
        le=1.0,
        description="seconds of frame handling one connection gets before the broker serves "
        "the others (a burst is worked through in slices of this length, in order)",
    )
    hello_timeout: float = Field(5.0, gt=0, description="seconds a new connection has to HELLO")
    heartbeat_interval: float = Field(
        10.0, gt=0, description="seconds between PINGs; a peer silent for 3 intervals is closed"
    )
    shutdown_timeout: float = Field(
        5.0, ge=0, description="seconds connections get to finish on SIGTERM"
    )
    ready_file: Path | None = Field(
        None, description="file to write 'host:port admin_port' to once listening"
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    neighbours: tuple[NeighbourConfig, ...] = Field(
        (), description="overlay neighbours; the broker with the smaller id dials the link"
    )
    peers: tuple[NeighbourConfig, ...] = Field(
        (),
        description="other overlay brokers this one may link to when reconfiguration moves it",
    )
    client_endpoints: dict[str, Endpoint] = Field(
        default_factory=dict,
        description="where clients dial the replicas of this broker's VN, by broker id, when "
        "not at their peers endpoint (containers behind published ports): a client given "
        "fewer endpoints than a majority of the VN is told these and connects to them",
    )
    links_file: Path | None = Field(
        None,
        description="where the broker keeps its current neighbours, so that a restart after "
        "live reconfiguration rejoins the tree as it is (read at start when present)",
    )
    reconfig: ReconfigConfig = Field(
        default_factory=ReconfigConfig, description="live OCBR reconfiguration"
    )
    traffic_log: TrafficLogConfig = Field(
        default_factory=TrafficLogConfig, description="traffic logs for analytics"
    )

    covering: bool = Field(True, description="suppress forwarding of covered subscriptions")
    vn: str | None = Field(None, description="this broker's virtual node (default: its id)")
    replica: int = Field(0, ge=0, description="this broker's index among its VN's replicas")
    vn_size: int = Field(
        1, ge=1, le=MAX_VN_SIZE, description="number of replicas of this broker's VN"
    )
    byzantine: Literal[ByzantineMode, "none"] = Field(
        "none", description="fault injection for tests and demos: misbehave as named"
    )
    manifest: FilePath | None = Field(
        None, description="overlay manifest (VN members and public keys) for confidential traffic"
    )
    key_file: FilePath | None = Field(None, description="this broker's Ed25519 private key (hex)")
    topic_trust: Path | None = Field(
        None,
        description="trusted TDNs file: turns on secured topics (broker/daemon/topic_guard.py)",
    )
    collude_log: Path | None = Field(
        None, description="with byzantine = 'collude': where to record every share seen"
    )
    link_backoff_max: float = Field(
        2.0, gt=0, description="largest pause between attempts to (re)open a broker link"
    )
    tls_cert: FilePath | None = Field(
        None,
        description="this broker's certificate (PEM, from trellis ca issue --broker); with "
        "tls_key and tls_ca the listener speaks TLS only and broker links are mutual TLS",
    )
    tls_key: FilePath | None = Field(None, description="the private key of tls_cert (PEM)")
    tls_ca: FilePath | None = Field(
        None,
        description="the project CA's certificate: peer brokers (and clients, unless "
        "tls_client_cert is 'optional') must present a certificate it issued",
    )
    tls_client_cert: Literal["required", "optional"] = Field(
        "required",
        description="whether clients must present a certificate from tls_ca (brokers always "
        "must, naming their own id)",
    )
    tls_handshake_timeout: float = Field(
        5.0, gt=0, description="seconds a TLS handshake may take before the connection is closed"
    )

    @field_validator("manifest")
    @classmethod
    def _manifest_readable(cls, value: Path | None) -> Path | None:
        return _readable(value, Manifest.load, "not a valid overlay manifest")

    @field_validator("key_file")
    @classmethod
    def _key_readable(cls, value: Path | None) -> Path | None:
        return _readable(value, _load_key, "not an Ed25519 private key (64 hex digits)")

    @field_validator("topic_trust")
    @classmethod
    def _trusted_tdns_readable(cls, value: Path | None) -> Path | None:
        return _readable(value, load_trusted_tdns, "not a trusted TDNs file")

    @field_validator("ready_file")
    @classmethod
    def _directory_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.parent.is_dir():
            raise ValueError(f"{value}: its directory {value.parent} does not exist")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> BrokerConfig:
        if self.replica >= self.vn_size:
            raise ValueError(
                f"replica = {self.replica} with vn_size = {self.vn_size}: a VN's replicas are "
                "numbered 0 to vn_size - 1"
            )
        for key in ("neighbours", "peers"):
            ids = [n.id for n in getattr(self, key)]
            if self.id in ids:
                raise ValueError(f"{key} lists {self.id!r}, this broker's own id")
            twice = sorted({i for i in ids if ids.count(i) > 1})
            if twice:
                raise ValueError(f"{key} lists {twice[0]!r} twice")
        _same_vn_agrees(self.neighbours)
        vn = self.vn or self.id
        replicas = {self.id} | {n.id for n in (*self.neighbours, *self.peers) if n.vn_id == vn}
        strangers = sorted(set(self.client_endpoints) - replicas)
        if strangers:
            raise ValueError(
                f"client_endpoints names {strangers[0]!r}, which neither neighbours nor peers "
                f"list as a replica of this broker's VN {vn!r}"
            )
        if self.max_copy_bytes_per_source < 2 * self.max_frame:
            raise ValueError(
                f"max_copy_bytes_per_source = {self.max_copy_bytes_per_source} is less than "
                f"twice max_frame = {self.max_frame}: an upstream replica's largest copies "
                "would be refused; raise it"
            )
        return self

    @model_validator(mode="after")
    def _tls_complete(self) -> BrokerConfig:
        given = {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_ca": self.tls_ca}
        missing = [name for name, value in given.items() if value is None]
        if missing and len(missing) < len(given):
            raise ValueError(
                "tls_cert, tls_key and tls_ca go together (TLS needs all three); missing "
                + ", ".join(missing)
            )
        return self

    @property
    def tls(self) -> bool:
        """Whether the broker speaks TLS (its listener and its links)."""
        return self.tls_cert is not None


def _same_vn_agrees(neighbours: Sequence[NeighbourConfig]) -> None:
    """Neighbours of one VN name one size for it and a replica index each."""
    seen: dict[str, NeighbourConfig] = {}
    taken: dict[tuple[str, int], str] = {}
    for n in neighbours:
        first = seen.setdefault(n.vn_id, n)
        if n.vn_size != first.vn_size:
            raise ValueError(
                f"neighbours {first.id!r} and {n.id!r} of VN {n.vn_id!r} disagree on its "
                f"vn_size ({first.vn_size} and {n.vn_size})"
            )
        other = taken.setdefault((n.vn_id, n.replica), n.id)
        if other != n.id:
            raise ValueError(
                f"neighbours {other!r} and {n.id!r} are both replica {n.replica} of VN {n.vn_id!r}"
            )


def _readable(path: Path | None, load: Callable[[Path], object], what: str) -> Path | None:
    """``path`` once ``load`` reads it; else the reason, naming the file."""
    if path is not None:
        try:
            load(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {what} ({exc})") from None
    return path


def _load_key(path: Path) -> object:
    return private_key_from_bytes(bytes.fromhex(path.read_text(encoding="utf-8").strip()))


def vn_of(config: BrokerConfig) -> str:
    """The virtual node a broker belongs to (a plain broker is a VN of one)."""
    return config.vn or config.id


def beside(config_file: str | Path, value: str | Path) -> Path:
    """A path written in a config file: a relative one is relative to the file's directory."""
    path = Path(value)
    return path if path.is_absolute() else Path(config_file).absolute().parent / path


def config_paths(model: BaseModel, prefix: str = "") -> dict[str, Path]:
    """Every file or directory a config names, by key (``table.key`` inside a table)."""
    found: dict[str, Path] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found.update(config_paths(value, f"{prefix}{name}."))
        elif isinstance(value, Path):
            found[prefix + name] = value
    return found


def _table(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a key that is a table (``reconfig``, ``traffic_log``), else None."""
    kind = field.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _is_path(annotation: Any) -> bool:
    return annotation is Path or any(_is_path(arg) for arg in get_args(annotation))


def _paths_beside(
    model: type[BaseModel], data: Mapping[str, Any], config_file: Path
) -> dict[str, Any]:
    """A file's ``data`` for ``model``, its relative paths made relative to ``config_file``."""
    out = dict(data)
    for name, value in data.items():
        field = model.model_fields.get(name)
        table = None if field is None else _table(field)
        if table is not None and isinstance(value, Mapping):
            out[name] = _paths_beside(table, value, config_file)
        elif field is not None and isinstance(value, str) and _is_path(field.annotation):
            out[name] = str(beside(config_file, value))
    return out


def _read_file(path: Path) -> dict[str, Any]:
    """A config file's keys (those under ``[broker]`` / ``broker:`` at the top level), paths
    made absolute. TOML, or YAML when the name ends in ``.yaml`` or ``.yml``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            # safe_load: plain data only (no tags that build Python objects)
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a YAML config must be a mapping of keys to values")
        data: dict[str, Any] = loaded
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if isinstance(data.get("broker"), dict):
        data = {**{k: v for k, v in data.items() if k != "broker"}, **data["broker"]}
    return _paths_beside(BrokerConfig, data, path)


def _from_text(name: str, field: FieldInfo, text: str) -> Any:
    """An environment variable's value for key ``name``: a list, a table or a map (such as
    ``client_endpoints``) is JSON text (``TRELLIS_TRAFFIC_LOG`` may also be ``off`` or the
    directory itself)."""
    if name == "traffic_log" and not text.lstrip().startswith("{"):
        off = text.strip().lower() in ("off", "false", "no", "0")
        return {"enabled": False} if off else {"dir": text.strip()}
    if _table(field) is None and get_origin(field.annotation) not in (tuple, dict):
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None


def is_config_override(variable: str) -> bool:
    """Whether a broker reads environment variable ``variable`` as a config override
    (``TRELLIS_<KEY>``, or ``TRELLIS_<TABLE>_<KEY>`` for a table such as ``reconfig``)."""
    for name, field in BrokerConfig.model_fields.items():
        key = ENV_PREFIX + name.upper()
        if variable == key or (_table(field) is not None and variable.startswith(key + "_")):
            return True
    return False


def _from_environment(
    env: Mapping[str, str], data: dict[str, Any], origin: dict[str, str]
) -> list[str]:
    """Apply ``TRELLIS_<KEY>`` and ``TRELLIS_<TABLE>_<KEY>`` to ``data``; the problems found."""
    problems = []
    for name, field in BrokerConfig.model_fields.items():
        key = ENV_PREFIX + name.upper()
        where = f"environment variable {key}"
        if key in env:
            try:
                data[name] = _from_text(name, field, env[key])
            except ValueError as exc:
                problems.append(f"{name} ({where}): {exc}")
            origin[name] = where
        table = _table(field)
        if table is None:
            continue
        for var in sorted(v for v in env if v.startswith(key + "_")):
            sub = var[len(key) + 1 :].lower()
            if sub not in table.model_fields:
                keys = ", ".join(table.model_fields)
                problems.append(f"{var}: {name} has no key {sub!r} (its keys: {keys})")
                continue
            if isinstance(data.setdefault(name, {}), dict):
                data[name] = {**data[name], sub: env[var]}
            origin[f"{name}.{sub}"] = f"environment variable {var}"
    return problems


def _problem(err: ErrorDetails, origin: Mapping[str, str], source: str) -> str:
    """One validation error: the key, where its value came from, what is wrong."""
    detail = err["msg"]
    if err["type"] == "value_error":  # our own message, without pydantic's "Value error, "
        detail = str(err.get("ctx", {}).get("error", detail))
    if err["type"].startswith("path_"):  # the path as resolved
        detail += f": {err['input']}"
    loc = [str(part) for part in err["loc"]]
    if not loc:  # a check across keys: its message names them
        return detail
    # the innermost key whose value came from somewhere known (reconfig.interval, reconfig)
    keys = (".".join(loc[:depth]) for depth in range(len(loc), 0, -1))
    where = next((origin[key] for key in keys if key in origin), source)
    return f"{'.'.join(loc)} ({where}): {detail}"


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Read, merge and validate a broker configuration.

    Args:
        path: a TOML file, or None for defaults only. Relative paths in it are relative to
            its directory.
        overrides: values from the command line, applied last (None values are skipped).
        environ: the environment to read ``TRELLIS_*`` from (default ``os.environ``).

    Raises:
        ConfigError: the file is missing or unparsable, or a value is invalid (a file it
            names included: missing, or not what the key needs).
    """
    source = str(path) if path else "<defaults>"
    data = _read_file(Path(path)) if path else {}
    origin = dict.fromkeys(data, source)
    problems = _from_environment(os.environ if environ is None else environ, data, origin)
    for name, value in (overrides or {}).items():
        if value is not None:
            data[name] = value
            origin[name] = "command line"
    if not problems:
        try:
            return BrokerConfig.model_validate(data)
        except ValidationError as exc:
            problems = [_problem(err, origin, source) for err in exc.errors()]
    raise ConfigError(f"invalid broker config in {source}: " + "; ".join(problems))
