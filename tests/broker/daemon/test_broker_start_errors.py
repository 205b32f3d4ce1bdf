"""``trellis broker`` that cannot start: one line naming what is wrong. Only a listener that
cannot bind says "cannot listen on"; a file says its config key and its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import trellis


def last_error(result_stderr: str) -> str:
    return result_stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("setting", "contents", "expected"),
    [
        (
            "key_file = 'b1.key'",
            None,
            "key_file ({config}): Path does not point to a file: {dir}/b1.key",
        ),
        (
            "manifest = 'm.json'",
            None,
            "manifest ({config}): Path does not point to a file: {dir}/m.json",
        ),
        ("manifest = 'bad'", "{", "manifest ({config}): {dir}/bad: not a valid overlay manifest ("),
        ("key_file = 'bad'", "zz", "key_file ({config}): {dir}/bad: not an Ed25519 private key ("),
        (
            "ready_file = 'run/r'",
            None,
            "ready_file ({config}): {dir}/run/r: its directory {dir}/run",
        ),
    ],
)
def test_a_file_the_broker_cannot_use_names_its_key_and_path_not_the_listener(
    tmp_path: Path, setting: str, contents: str | None, expected: str
) -> None:
    if contents is not None:
        (tmp_path / "bad").write_text(contents)
    path = tmp_path / "broker.toml"
    path.write_text(f"port = 0\n{setting}\n")
    result = trellis("broker", "--config", str(path), timeout=30)
    assert result.returncode == 2
    line = last_error(result.stderr)
    assert line.startswith("trellis broker: error: invalid broker config in ")
    assert expected.format(config=path, dir=tmp_path) in line
    assert "cannot listen" not in line


def test_a_ready_file_the_broker_cannot_write_names_the_key_not_the_listener(
    tmp_path: Path,
) -> None:
    taken = tmp_path / "ready"
    taken.mkdir()  # a directory where the ready file should go: found once it listens
    result = trellis("broker", "--port", "0", "--ready-file", str(taken), timeout=30)
    assert result.returncode == 2
    assert last_error(result.stderr) == (
        f"trellis broker: error: ready_file = {taken}: Is a directory"
    )


def test_json_in_the_environment_that_does_not_parse_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRELLIS_NEIGHBOURS", "[{id: b2}]")
    result = trellis("broker", "--port", "0", timeout=30)
    assert result.returncode == 2
    assert "neighbours (environment variable TRELLIS_NEIGHBOURS): not valid JSON" in (
        last_error(result.stderr)
    )
