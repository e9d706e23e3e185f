"""What a path names: a file, a folder, a hub dataset's downloaded folder or a hub id; each mistake its own line."""
import pytest

from core.errors import InputDataError, MissingFileError
from core.input_paths import check_input_folder, hub_download_folder


def test_a_hub_path_is_its_downloaded_folder_made_absolute_or_else_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "parquet").mkdir()  # called like one of datasets' own loaders: only the absolute path is unambiguous
    (tmp_path / "a.parquet").write_bytes(b"x")
    assert hub_download_folder("parquet", "hub dataset") == tmp_path / "parquet"
    assert hub_download_folder("./parquet", "hub dataset") == tmp_path / "parquet"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_download_folder("~/parquet", "hub dataset") == tmp_path / "parquet"
    for hub_id in ("wikimedia/wikipedia", "glue", "hf://datasets/nyu-mll/glue", "user/name/sub"):
        assert hub_download_folder(hub_id, "hub dataset") is None, hub_id
    for path in ("./wiki", "../wiki", "~/wiki", str(tmp_path / "wiki")):
        with pytest.raises(MissingFileError, match=f"hub dataset folder '{path}' does not exist"):
            hub_download_folder(path, "hub dataset")
    with pytest.raises(InputDataError, match="'a.parquet' is a file; name a hub dataset id or the folder"):
        hub_download_folder("a.parquet", "hub dataset")


def test_a_folder_argument_is_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "glue").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    assert check_input_folder("glue", "GLUE folder") == tmp_path / "glue"
    with pytest.raises(InputDataError, match="GLUE folder '.*notes.txt' is a file; name a folder"):
        check_input_folder("notes.txt", "GLUE folder")
    with pytest.raises(MissingFileError, match="GLUE folder '.*none' does not exist"):
        check_input_folder("none", "GLUE folder")
