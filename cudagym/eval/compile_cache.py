"""A portable torch.compile cache: what the baseline judges compiled, in one file a user carries to a
new machine of the same kind (issue 16), so its first `cudagym baseline run` finds its compiles in
the caches.

A judge of a baseline run (modes `warm` and `baseline`) saves, as it ends, the artifacts torch
recorded for its compiles, cache hits included (`torch.compiler.save_cache_artifacts`), into
`artifacts_dir()` under the inductor cache, one file per distinct content with the keys it holds
beside it. `export_cache` bundles them (a zip: a manifest, and each file that adds a key no other
holds); `import_cache` loads a bundle into this machine's caches (`load_cache_artifacts`: inductor's
FX graph and AOT autograd caches; Triton's kernels only as far as inductor's entries bundle them). Artifacts are keyed by torch's own cache keys
(torch version, device, the graph): one made elsewhere never gives a wrong kernel, at worst a miss.
A bundle of another torch version is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path

FORMAT = "cudagym-compile-cache/1"
MANIFEST = "manifest.json"
ARTIFACTS = "cudagym-artifacts"  # the folder of judges' artifacts in the inductor cache


class CacheError(ValueError):
    """A bundle that cannot be made or loaded; the message is one line (the CLI prints it as its error)."""


def artifacts_dir() -> Path:
    """Where judges leave their artifacts: beside the inductor cache they share (evaluate._cache_dirs)."""
    from cudagym.eval.evaluate import _cache_dirs

    _cache_dirs()  # sets TORCHINDUCTOR_CACHE_DIR to cudagym's cache unless the caller set it
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / ARTIFACTS


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def save_artifacts(folder: str | Path | None = None) -> Path | None:
    """In a judge: the artifacts of this process's compiles to `folder` (default `artifacts_dir()`), as
    {sha256}.bin with {sha256}.json (torch version and keys); None if torch recorded none."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if not saved:
        return None
    data, info = saved
    keys = {kind: sorted(names) for kind, names in info.artifacts.items() if names}
    if not keys:
        return None
    folder = Path(folder or artifacts_dir())
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest}.bin"
    if path.exists():
        os.utime(path)  # used again: its mtime says when a run last had these compiles
    else:
        for target, content in ((folder / f"{digest}.json", json.dumps({"torch": _torch_version(), "keys": keys}).encode()),
                                (path, data)):  # the .bin last: a .bin always has its keys
            scratch = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            scratch.write_bytes(content)
            os.replace(scratch, target)
    return path


def _local_artifacts(folder: Path) -> list[tuple[Path, dict]]:
    found = []
    for path in sorted(folder.glob("*.bin")) if folder.is_dir() else []:
        try:
            meta = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            continue  # written by something else, or half written
        found.append((path, meta))
    return found


def export_cache(out: str | Path, folder: str | Path | None = None) -> dict:
    """Bundle this machine's artifacts of this torch version into `out`; {artifacts, keys, bytes}.
    A file whose keys others hold already is left out (judges of later runs record their cache
    hits again), the biggest first."""
    folder = Path(folder or artifacts_dir())
    version = _torch_version()
    found = [(p, m) for p, m in _local_artifacts(folder) if m.get("torch") == version]
    if not found:
        raise CacheError(f"no compile artifacts of torch {version} in {folder}: run `cudagym baseline run` first")
    covered: set[tuple[str, str]] = set()
    chosen = []
    for path, meta in sorted(found, key=lambda pm: -sum(len(v) for v in pm[1]["keys"].values())):
        keys = {(kind, name) for kind, names in meta["keys"].items() for name in names}
        if keys - covered:
            covered |= keys
            chosen.append((path, meta))
    manifest = {"format": FORMAT, "torch": version,
                "artifacts": [{"file": f"artifacts/{p.name}", "keys": m["keys"]} for p, m in chosen]}
    out = Path(out)
    scratch = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(scratch, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
            bundle.writestr(MANIFEST, json.dumps(manifest, indent=1))
            for path, _ in chosen:
                bundle.write(path, f"artifacts/{path.name}")
        os.replace(scratch, out)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise CacheError(f"cannot write {out}: {exc.strerror or exc}") from None
    return {"artifacts": len(chosen), "keys": len(covered), "bytes": out.stat().st_size}


def read_manifest(path: str | Path) -> dict:
    """A bundle's manifest, checked: a cudagym compile cache of this torch version."""
    path = Path(path)
    if not path.is_file():
        raise CacheError(f"no such file: {path}")
    try:
        with zipfile.ZipFile(path) as bundle:
            manifest = json.loads(bundle.read(MANIFEST))
    except (zipfile.BadZipFile, KeyError, ValueError):
        raise CacheError(f"{path} is not a compile cache made by `cudagym baseline cache export`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CacheError(f"{path} is not a compile cache of format {FORMAT}")
    if manifest.get("torch") != _torch_version():
        raise CacheError(f"{path} was made with torch {manifest.get('torch')}, this is torch {_torch_version()}:"
                         " its compiles would never be found")
    return manifest


def import_cache(path: str | Path) -> dict:
    """Load a bundle into this machine's compile caches (those the judges use); {artifacts, keys}."""
    manifest = read_manifest(path)
    artifacts_dir()  # the judges' cache folders, where the loaded artifacts must land
    import torch

    quiet = logging.getLogger("torch.compiler._cache")  # torch logs a traceback for a blob it cannot read
    level, loaded = quiet.level, 0
    quiet.setLevel(logging.ERROR)
    try:
        with zipfile.ZipFile(path) as bundle:
            for entry in manifest["artifacts"]:
                try:
                    info = torch.compiler.load_cache_artifacts(bundle.read(entry["file"]))
                except Exception as exc:
                    raise CacheError(f"{path}: {entry.get('file')} does not load: {type(exc).__name__}: {exc}"[:300]) from None
                if info is None:
                    raise CacheError(f"{path}: {entry.get('file')} does not load: not torch's cache artifacts")
                loaded += 1
    finally:
        quiet.setLevel(level)
    return {"artifacts": loaded, "keys": sum(len(v) for e in manifest["artifacts"] for v in e["keys"].values())}
