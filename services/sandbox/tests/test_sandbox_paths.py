"""Path decisions (a profile's path rules too) and output cutting, which need no disk and no
server."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from helmline.sandbox._errors import ToolRefused
from helmline.sandbox._output import cut_text
from helmline.sandbox._paths import PathRules, is_inside, rule_path, workspace_of, workspace_path


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("notes.txt", "notes.txt"),
        ("./a//b/", "a/b"),
        ("a/../b", "b"),
        (".", "."),
        ("a/b/../../c", "c"),
        ("..hidden", "..hidden"),
    ],
)
def test_relative_paths_are_normalised(argument: str, expected: str) -> None:
    assert workspace_path(argument) == PurePosixPath(expected)


@pytest.mark.parametrize(
    ("argument", "kind", "reason"),
    [
        ("../../etc/passwd", "permission", "outside the workspace"),
        ("..", "permission", "outside the workspace"),
        ("a/../../b", "permission", "outside the workspace"),
        ("/etc/passwd", "permission", "absolute"),
        ("", "validation", "not a usable file name"),
        ("a\x00b", "validation", "not a usable file name"),
    ],
)
def test_paths_leaving_the_workspace_are_refused(argument: str, kind: str, reason: str) -> None:
    with pytest.raises(ToolRefused) as refused:
        workspace_path(argument)
    assert refused.value.error.kind == kind
    assert reason in refused.value.error.message
    assert repr(argument) in refused.value.error.message
    assert refused.value.error.field == "/path"


def test_inside_compares_whole_components() -> None:
    assert is_inside("/w/ws", "/w/ws")
    assert is_inside("/w/ws", "/w/ws/a/b")
    assert not is_inside("/w/ws", "/w/ws2/a")
    assert not is_inside("/w/ws", "/w")


def test_each_session_has_its_own_workspace() -> None:
    root = Path("/data/workspaces")
    assert workspace_of(root, "acme", "s1") == root / "acme" / "s1"
    assert workspace_of(root, "acme", "s1") != workspace_of(root, "other", "s1")


def test_cut_text_never_splits_a_character() -> None:
    assert cut_text("éé".encode(), 3) == ("é", True)
    assert cut_text(b"abc", 3) == ("abc", False)
    assert cut_text(b"\xff", 3) == ("\ufffd", False)


RULES = PathRules(
    read_only=(PurePosixPath("config"),),
    blocked=(PurePosixPath(".env"), PurePosixPath("config/keys")),
)


@pytest.mark.parametrize(
    ("path", "changing", "refused_for"),
    [
        ("config", False, None),
        ("config/app.ini", False, None),
        ("config/app.ini", True, "'config', which this call's sandbox profile keeps read-only"),
        ("config", True, "read-only"),
        ("config/keys/a", False, "'config/keys', which this call's sandbox profile blocks"),
        (".env", False, "blocks"),
        (".env", True, "blocks"),
        (".envrc", True, None),  # Whole components: a longer name is another path.
        ("configs/x", True, None),
        (".", True, None),
    ],
)
def test_path_rules_refuse_what_they_cover(
    path: str, changing: bool, refused_for: str | None
) -> None:
    if refused_for is None:
        RULES.check(PurePosixPath(path), path, changing=changing)
        return
    with pytest.raises(ToolRefused) as refused:
        RULES.check(PurePosixPath(path), path, changing=changing)
    assert refused.value.error.kind == "permission"
    assert refused_for in refused.value.error.message
    assert repr(path) in refused.value.error.message


def test_blocked_paths_are_hidden_and_read_only_ones_are_not() -> None:
    assert RULES.hides(PurePosixPath("config/keys/a"))
    assert not RULES.hides(PurePosixPath("config/app.ini"))
    assert not RULES.hides(PurePosixPath("config"))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("/etc", "absolute"),
        ("../x", "outside the workspace"),
        (".", "the whole workspace"),
        ("a/..", "the whole workspace"),
    ],
)
def test_a_rule_names_a_part_of_the_workspace(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        rule_path(text)
    assert rule_path("./secrets/") == PurePosixPath("secrets")
