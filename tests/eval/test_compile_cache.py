"""The portable compile cache's file (`cudagym baseline cache export` / `import`): what a bundle holds,
and the CLI's one-line errors. Loading real artifacts is tested end to end in test_baseline_pipeline."""

from __future__ import annotations

import json
import lzma
import os
import zipfile

import pytest
import torch

from cudagym.cli import main
from cudagym.eval import compile_cache
from cudagym.eval.compile_cache import ARTIFACTS, FORMAT, CacheError, export_cache, read_manifest

VERSION = torch.__version__.split("+")[0]


def _artifact(folder, name: str, keys: dict, version: str = VERSION) -> None:
    """A judge's saved file: torch's serialization of artifacts with these keys (content: kind:key)."""
    from torch.compiler._cache import CacheArtifactFactory, CacheArtifactManager

    CacheArtifactManager._ensure_cache_artifacts_registered()
    pairs = [(kind, CacheArtifactFactory.create(kind, key, f"{kind}:{key}".encode() * 100))
             for kind, names in keys.items() for key in names]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.bin").write_bytes(compile_cache._serialized(pairs))
    (folder / f"{name}.json").write_text(json.dumps({"torch": version, "keys": keys}))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This test's inductor cache (the judges' and the CLI's), with its artifacts folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor" / ARTIFACTS


@pytest.mark.parametrize("part_bytes", [1, 1 << 20], ids=["a-part-per-artifact", "one-part"])
def test_an_export_holds_each_artifact_of_this_torch_once_and_an_import_writes_every_one(cache, tmp_path, monkeypatch,
                                                                                         capsys, part_bytes):
    monkeypatch.setattr(compile_cache, "PART_BYTES", part_bytes)
    _artifact(cache, "a", {"aot_autograd": ["g1", "g2"], "autotune": ["x1"]})
    _artifact(cache, "b", {"aot_autograd": ["g1"]})  # a timing judge's cache hit: nothing new
    _artifact(cache, "c", {"aot_autograd": ["g2", "g3"]})  # one new, one held by a
    _artifact(cache, "d", {"aot_autograd": ["g4"]}, version="1.0.0")  # another torch: never found
    (cache / "e.bin").write_bytes(b"half written")  # no keys beside it
    out = tmp_path / "cache.zip"
    assert main(["baseline", "cache", "export", str(out)]) == 0
    assert "4 compiled graphs" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest["format"] == FORMAT and manifest["torch"] == VERSION
    held = [(kind, key) for e in manifest["artifacts"] for kind, keys in e["keys"].items() for key in keys]
    assert sorted(held) == [("aot_autograd", "g1"), ("aot_autograd", "g2"), ("aot_autograd", "g3"), ("autotune", "x1")]
    assert len(manifest["artifacts"]) == (4 if part_bytes == 1 else 1)
    with zipfile.ZipFile(out) as z:  # the parts are torch's serialization, xz-compressed
        for entry in manifest["artifacts"]:
            found = compile_cache._artifacts_of(lzma.decompress(z.read(entry["file"])))
            assert {(k, a.content) for k, a in found.items()} == {
                ((kind, key), f"{kind}:{key}".encode() * 100) for kind, keys in entry["keys"].items() for key in keys}

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert main(["baseline", "cache", "import", str(out)]) == 0
    for key in ("g1", "g2", "g3"):  # AOT autograd's cache entries, written where its cache looks
        [entry] = (tmp_path / "elsewhere").rglob(key)
        assert [f.read_bytes() for f in entry.iterdir()] == [f"aot_autograd:{key}".encode() * 100]


def test_a_bundle_of_the_first_format_still_loads(cache, tmp_path, capsys):
    _artifact(cache, "a", {"aot_autograd": ["g1"]})
    out = tmp_path / "old.zip"
    with zipfile.ZipFile(out, "w") as z:  # format /1: the judges' files as they were, deflated
        z.writestr("manifest.json", json.dumps({"format": "cudagym-compile-cache/1", "torch": VERSION,
                                                "artifacts": [{"file": "artifacts/a.bin", "keys": {"aot_autograd": ["g1"]}}]}))
        z.write(cache / "a.bin", "artifacts/a.bin")
    assert main(["baseline", "cache", "import", str(out)]) == 0
    assert "1 artifact files (1 compiled graphs)" in capsys.readouterr().out


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
    cache.mkdir(parents=True)
    (cache / "junk.bin").write_bytes(b"not torch's serialization")
    (cache / "junk.json").write_text(json.dumps({"torch": VERSION, "keys": {"inductor": ["g1"]}}))
    export_cache(tmp_path / "junk.zip")  # bundled whole: its import says it does not load
    assert "does not load" in error("import", str(tmp_path / "junk.zip"))
    with pytest.raises(CacheError, match="cannot write"):
        compile_cache.export_cache(tmp_path / "no-such-folder" / "x.zip")


def test_a_static_autotuner_from_another_machines_cache_tunes_into_this_ones(tmp_path, monkeypatch):
    """torch pickles a statically launchable Triton autotuner with its kernel's absolute path: loaded
    from a carried bundle it would read and write its best config in the exporter's cache folder."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    here = tmp_path / "here"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(here))
    monkeypatch.setattr(CachingAutotuner, "recheck_autotune_cache", CachingAutotuner.recheck_autotune_cache)
    compile_cache.reroot_static_autotuners()
    compile_cache.reroot_static_autotuners()  # a judge compiles many times: wrapped once
    tuner = object.__new__(CachingAutotuner)
    tuner.compile_results = []
    tuner.filename = "/tmp/cudagym-cache.w028/inductor/ee/ceewmrxfma3m5nur.py"
    # its save hook, as pickled: torch's AutotuneCache for the kernel's file where it was compiled
    tuner.save_cache_hook = AutotuneCache.create({}, tuner.filename, "confighash").save
    saved_to = tuner.save_cache_hook.__self__.local_cache[1]
    assert saved_to.startswith("/tmp/cudagym-cache.w028/inductor/ee/") and saved_to.endswith(".best_config")
    with pytest.raises(AssertionError):  # torch's own method ran after the path was re-rooted (no kernels here)
        tuner.recheck_autotune_cache(reload_kernel_from_src=lambda: None)
    assert tuner.filename == str(here / "ee" / "ceewmrxfma3m5nur.py")
    assert tuner.save_cache_hook.__self__.local_cache[1] == str(here / "ee" / os.path.basename(saved_to))
    tuner.filename = str(here / "ab" / "cab.py")  # compiled here: left as it is
    with pytest.raises(AssertionError):
        tuner.recheck_autotune_cache(reload_kernel_from_src=lambda: None)
    assert tuner.filename == str(here / "ab" / "cab.py")
