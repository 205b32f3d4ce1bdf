"""The ``[placement]`` section: the example in deploy/ loads, and mistakes name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.placement_config import (
    PlacementConfig,
    PlacementConfigError,
    load_placement_config,
    parse_arrow,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "placement.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "placement.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_deploy_example_loads_and_resolves_its_weights() -> None:
    config = load_placement_config(EXAMPLE)
    assert config.budget == 12
    assert config.max_per_path == 9
    assert config.path_keys() == [("b0", "b4"), ("b0", "b2"), ("b1", "b3")]
    # b0 -> b4 is alice -> bob (pair 3.0 beats publisher 1.5); b0 -> b2 only alice's 1.5;
    # b1 -> b3 its path weight.
    assert config.omega(config.path_keys() or []) == {
        ("b0", "b4"): 3.0,
        ("b0", "b2"): 1.5,
        ("b1", "b3"): 2.0,
    }


def test_no_file_means_defaults() -> None:
    config = load_placement_config(None)
    assert config == PlacementConfig()
    assert config.budget is None
    assert config.path_keys() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[placement]\nbudgit = 3\n", "placement.budgit: Extra inputs are not permitted"),
        ("[placement]\nbudget = -1\n", "placement.budget: Input should be greater than or equal"),
        ("[placement]\nmax_per_path = 'x'\n", "placement.max_per_path:"),
        ("[placement]\npaths = ['b0 b1']\n", "placement.paths: expected 'SRC -> DST'"),
        (
            "[placement.weights.paths]\n'b0 -> b1' = -2\n",
            "placement.weights.paths.b0 -> b1: Input should be greater than or equal to 0",
        ),
        (
            "[placement.weights.publishers]\nalice = 1.0\n",
            "client(s) alice with no VN in placement.clients",
        ),
        ("[placement.weights]\nvns = {}\n", "placement.weights.vns: Extra inputs"),
        ("[other]\nx = 1\n", "no [placement] section"),
        ("[placement\n", "not valid TOML"),
    ],
)
def test_a_mistake_names_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PlacementConfigError) as caught:
        load_placement_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlacementConfigError, match=r"nope\.toml: no such config file"):
        load_placement_config(tmp_path / "nope.toml")


def test_parse_arrow() -> None:
    assert parse_arrow(" b0->b3 ") == ("b0", "b3")
    for bad in ("b0", "-> b3", "b0 ->", "a -> b -> c"):
        with pytest.raises(ValueError, match="SRC -> DST"):
            parse_arrow(bad)


def test_the_readme_example_loads(tmp_path: Path) -> None:
    readme = (EXAMPLE.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Replica placement", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    config = load_placement_config(write(tmp_path, block))
    assert config.path_keys() == [("b0", "b4"), ("b1", "b3")]
    assert config.omega([("b0", "b4"), ("b1", "b3")]) == {("b0", "b4"): 3.0, ("b1", "b3"): 2.0}
