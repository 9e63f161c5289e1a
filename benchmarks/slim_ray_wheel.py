"""Ray for the GPU box: a slimmed wheel and the few dependencies its image lacks, in `.whl-ray/`.

The GPU box has no internet and a call carries at most 64 MiB; the ray 2.60.0 cp312 manylinux wheel
is 79 MB. The `ray` runner needs Ray's core (raylet, GCS, workers, actors), so this repacks the
wheel without:
- ray/jars (Java workers, 31 MB) and ray/dashboard/client/build (the web UI and its source maps);
- the libraries built on Ray that cudagym does not import (rllib, data, serve, tune, train, llm);
  --keep-libraries keeps them;
and with the symbol tables stripped from the three big binaries (raylet, gcs_server, _raylet.so;
dynamic symbols stay, so they link and run as before) and those binaries LZMA-compressed inside the
zip (pip installs through Python's zipfile, which reads LZMA); --no-strip and --deflate turn these off.
RECORD is rewritten for what changed. Then it downloads the dependencies the GPU image lacks
(jsonschema and its own; KINDS.md lists click, msgpack, protobuf, pyyaml, requests, filelock,
packaging, aiosignal, frozenlist, attrs, ... as present); --all-deps downloads every one of Ray's.

Usage (repo root, where pip can reach PyPI): python benchmarks/slim_ray_wheel.py [--out .whl-ray]
On the GPU box: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-ray/*.whl
(benchmarks/gpu_env.sh does this when .whl-ray is there; .gitignore has it). Name it in `carry`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
DROP = ("ray/jars/", "ray/dashboard/client/build/")
LIBRARIES = ("ray/rllib/", "ray/data/", "ray/serve/", "ray/tune/", "ray/train/", "ray/llm/")
BINARIES = ("ray/core/src/ray/raylet/raylet", "ray/core/src/ray/gcs/gcs_server", "ray/_raylet.so")
MISSING_ON_GPU_IMAGE = ["jsonschema", "jsonschema-specifications", "referencing", "rpds-py"]
RAY_DEPS = MISSING_ON_GPU_IMAGE + ["click", "filelock", "msgpack", "packaging", "protobuf", "pyyaml", "requests",
                                   "aiosignal", "frozenlist", "attrs", "aiohappyeyeballs", "multidict", "propcache",
                                   "yarl", "idna", "charset-normalizer", "urllib3", "certifi", "typing-extensions"]


def download(names: list[str], dest: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *names], check=True)


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def strip_symbols(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "binary"
        path.write_bytes(data)
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def slim(wheel: Path, out: Path, keep_libraries: bool, strip: bool, lzma: bool) -> Path:
    drop = DROP + (() if keep_libraries else LIBRARIES)
    target = out / wheel.name
    changed: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record_name or info.filename.startswith(drop):
                continue
            data = src.read(info)
            if info.filename in BINARIES:
                if strip:
                    data = changed[info.filename] = strip_symbols(data)
                if lzma:
                    info.compress_type = zipfile.ZIP_LZMA
            dst.writestr(info, data)
        rows = []
        for line in src.read(record_name).decode().splitlines():
            path = line.split(",")[0]
            if path.startswith(drop):
                continue
            rows.append(f"{path},{record_hash(changed[path])},{len(changed[path])}" if path in changed else line)
        dst.writestr(src.getinfo(record_name), "\n".join(rows) + "\n")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="2.60.0")
    parser.add_argument("--out", default=".whl-ray")
    parser.add_argument("--keep-libraries", action="store_true", help="keep rllib, data, serve, tune, train, llm")
    parser.add_argument("--no-strip", action="store_true", help="keep the binaries' symbol tables")
    parser.add_argument("--deflate", action="store_true", help="no LZMA inside the wheel")
    parser.add_argument("--all-deps", action="store_true", help="every dependency of Ray, not only those the GPU image lacks")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        download([f"ray=={args.version}"], Path(tmp))
        wheel = next(Path(tmp).glob("ray-*.whl"))
        slim(wheel, out, args.keep_libraries, strip=not args.no_strip and shutil.which("strip") is not None,
             lzma=not args.deflate)
        original = wheel.stat().st_size
    download(RAY_DEPS if args.all_deps else MISSING_ON_GPU_IMAGE, out)
    files = sorted(out.glob("*.whl"))
    for path in files:
        print(f"{path.stat().st_size / 1e6:7.2f} MB  {path.name}")
    print(f"{sum(p.stat().st_size for p in files) / 1e6:7.2f} MB  in {out}/ (the ray wheel was {original / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
