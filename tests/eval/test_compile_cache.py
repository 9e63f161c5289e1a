"""The portable compile cache's file (`cudagym baseline cache export` / `import`): what a bundle holds,
and the CLI's one-line errors. Loading real artifacts is tested end to end in test_baseline_pipeline."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from cudagym.cli import main
from cudagym.eval import compile_cache
from cudagym.eval.compile_cache import ARTIFACTS, FORMAT, CacheError, export_cache, read_manifest

VERSION = torch.__version__.split("+")[0]


def _artifact(folder, name: str, keys: dict, version: str = VERSION) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.bin").write_bytes(name.encode() * 10)
    (folder / f"{name}.json").write_text(json.dumps({"torch": version, "keys": keys}))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This test's inductor cache (the judges' and the CLI's), with its artifacts folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor" / ARTIFACTS


def test_an_export_bundles_each_artifact_file_that_adds_a_graph_of_this_torch(cache, tmp_path, capsys):
    _artifact(cache, "a", {"inductor": ["g1", "g2"], "aot_autograd": ["x1"]})
    _artifact(cache, "b", {"inductor": ["g1"]})  # a later run's cache hits: nothing new
    _artifact(cache, "c", {"inductor": ["g3"]})
    _artifact(cache, "d", {"inductor": ["g4"]}, version="1.0.0")  # another torch: never found
    (cache / "e.bin").write_bytes(b"half written")  # no keys beside it
    out = tmp_path / "cache.zip"
    assert main(["baseline", "cache", "export", str(out)]) == 0
    assert "2 artifact files, 4 compiled graphs" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest["format"] == FORMAT and manifest["torch"] == VERSION
    assert [e["file"] for e in manifest["artifacts"]] == ["artifacts/a.bin", "artifacts/c.bin"]
    with zipfile.ZipFile(out) as z:
        assert z.read("artifacts/c.bin") == (cache / "c.bin").read_bytes()


def test_cache_commands_fail_in_one_line(cache, tmp_path, capsys):
    def error(*argv: str) -> str:
        assert main(["baseline", "cache", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("cudagym: error: ")
        return err

    assert "run `cudagym baseline run` first" in error("export", str(tmp_path / "x.zip"))
    assert "no such file" in error("import", str(tmp_path / "missing.zip"))
    (tmp_path / "text.zip").write_text("not a zip")
    assert "not a compile cache" in error("import", str(tmp_path / "text.zip"))
    for name, manifest, says in (("other.zip", {"format": "something/9"}, "not a compile cache of format"),
                                 ("old.zip", {"format": FORMAT, "torch": "1.0.0", "artifacts": []}, "made with torch 1.0.0")):
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr("manifest.json", json.dumps(manifest))
        assert says in error("import", str(tmp_path / name))
    _artifact(cache, "junk", {"inductor": ["g1"]})  # not torch's serialization
    export_cache(tmp_path / "junk.zip")
    assert "does not load" in error("import", str(tmp_path / "junk.zip"))
    with pytest.raises(CacheError, match="cannot write"):
        compile_cache.export_cache(tmp_path / "no-such-folder" / "x.zip")
