"""What a run records of its machine: installed versions read without importlib.metadata."""

import importlib.metadata

import pytest

from cpkv.core.envinfo import package_version


@pytest.mark.parametrize(
    "name", ["numpy", "PyYAML", "pyyaml", "typing_extensions", "Typing-Extensions", "cpkv"]
)
def test_package_versions_are_importlib_metadatas(name):
    """Each installed package's version is the one importlib.metadata reads from its
    metadata (names compared as packaging normalises them)."""
    assert package_version(name) == importlib.metadata.version(name)


def test_an_absent_package_has_no_version(tmp_path, monkeypatch):
    """A project with no metadata folder on the path is absent; one whose folder is there
    has the version its folder names."""
    assert package_version("no-such-project-cpkv") is None
    (tmp_path / "no_such_project_cpkv-1.2.3.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version("No.Such-Project_cpkv") == "1.2.3"
