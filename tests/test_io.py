"""Atomic outputs: complete or absent, ordinary permissions, one-line errors for bad paths."""

from __future__ import annotations

import os
import stat

import pytest

from shortcutlab.io import OutputError, atomic_dir, atomic_files, check_writable, write_json, write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_outputs_get_the_mode_an_ordinary_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "x")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
        assert _mode(tmp_path / "a.txt") == _mode(tmp_path / "plain.txt") == 0o644
        with atomic_dir(tmp_path / "folder") as d:
            write_text(os.path.join(d, "f"), "y")
        os.mkdir(tmp_path / "plain_folder")
        assert _mode(tmp_path / "folder") == _mode(tmp_path / "plain_folder") == 0o755
    finally:
        os.umask(old)


def test_staged_files_appear_together_or_not_at_all(tmp_path):
    write_text(tmp_path / "a", "old a")
    write_text(tmp_path / "b", "old b")
    with pytest.raises(RuntimeError):
        with atomic_files() as stage:
            open(stage.path(tmp_path / "a"), "w").write("new a")
            open(stage.path(tmp_path / "b"), "w").write("new b")
            raise RuntimeError("failed before the end")
    assert (tmp_path / "a").read_text() == "old a" and (tmp_path / "b").read_text() == "old b"
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
    with atomic_files() as stage:
        open(stage.path(tmp_path / "a"), "w").write("new a")
        open(stage.path(tmp_path / "b"), "w").write("new b")
    assert (tmp_path / "a").read_text() == "new a" and (tmp_path / "b").read_text() == "new b"


def test_a_failed_folder_build_leaves_the_old_folder(tmp_path):
    out = tmp_path / "bench"
    with atomic_dir(out) as d:
        write_text(os.path.join(d, "x"), "1")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(out) as d:
            write_text(os.path.join(d, "x"), "2")
            raise KeyboardInterrupt
    assert (out / "x").read_text() == "1" and sorted(os.listdir(tmp_path)) == ["bench"]


def test_unwritable_paths_are_named(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_writable(tmp_path / "file" / "out.json")
    with pytest.raises(OutputError, match="it is a folder"):
        write_json(tmp_path, {"a": 1})


def test_a_published_file_has_the_ordinary_mode_even_if_its_writer_made_it_private(tmp_path):
    from shortcutlab.io import atomic_path

    with atomic_path(tmp_path / "w.bin") as tmp:
        os.remove(tmp)  # as safetensors does: a new file, private
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
    (tmp_path / "plain").write_text("")
    assert stat.S_IMODE(os.stat(tmp_path / "w.bin").st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)


def test_replacing_an_output_keeps_a_nested_output_and_lists_only_its_own_files(tmp_path):
    from shortcutlab.io import MARKER, read_marker, write_marker

    out = tmp_path / "rep"
    with atomic_dir(out, "report", ["a.txt", "figs/"]) as d:
        write_text(os.path.join(d, "a.txt"), "1")
        os.mkdir(os.path.join(d, "figs"))
        write_text(os.path.join(d, "figs", "f.png"), "png")
    assert read_marker(out)["files"] == ["a.txt", "figs/f.png"]
    nested = out / "sub"
    nested.mkdir()
    write_text(nested / "x.csv", "nested")
    write_marker(nested, "sweep")  # a nested output of its own: owned, and kept on replace
    with atomic_dir(out, "report", ["a.txt", "figs/"]) as d:
        write_text(os.path.join(d, "a.txt"), "2")
    assert sorted(os.listdir(out)) == [MARKER, "a.txt", "sub"]
    assert (out / "a.txt").read_text() == "2" and (nested / "x.csv").read_text() == "nested"
    assert sorted(os.listdir(tmp_path)) == ["rep"]  # no temporary left beside it
