"""The deployment files stay valid: compose broker configs load and form a tree."""

from __future__ import annotations

from pathlib import Path

from broker.daemon.config import load_config
from overlay.tree import Tree

ROOT = Path(__file__).resolve().parent.parent


def test_compose_broker_configs_load_and_link_into_a_tree() -> None:
    configs = [load_config(path, environ={}) for path in sorted(ROOT.glob("deploy/compose/*.toml"))]
    assert configs, "no compose configs"
    links = {tuple(sorted((c.id, n.id))) for c in configs for n in c.neighbours}
    tree = Tree([c.id for c in configs], links)
    for config in configs:
        assert {n.id for n in config.neighbours} == tree.neighbours(config.id)
    compose = (ROOT / "docker-compose.yml").read_text()
    for config in configs:
        assert f"deploy/compose/{config.id}.toml" in compose
