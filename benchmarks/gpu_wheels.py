"""The wheels a GPU machine's image lacks (rlpr built from this tree, gguf, math-verify and its needs, at the
versions installed here, for CPython 3.12 manylinux), into the git-ignored `.whl/`; it checks that every
requirement is in IMAGE or among the wheels and prints the GPU machine's install line (docs/distributed.md).

    python benchmarks/gpu_wheels.py
"""

from __future__ import annotations

import argparse
import hashlib
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=str(WHEELS))
    args = ap.parse_args(argv)
    dest = Path(args.dest)
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
        print(f"gpu_wheels: {rlpr_wheel.name} differs from src/rlpr: {stale[:5]}", file=sys.stderr)
        return 1
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pins = [f"{name}=={version(name)}" for name in CARRIED]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-q", "-d", str(dest), *pins], check=True)
    wheels = sorted(dest.glob("*.whl"))
    for w in wheels:
        print(f"{w.name}  {w.stat().st_size / 1024:.0f} KiB")
    gaps = missing(wheels)
    if gaps:
        print(f"gpu_wheels: requirements that neither the image nor {dest} provide: {gaps}", file=sys.stderr)
        return 1
    print(f"\n{len(wheels)} wheels in {dest}; on the GPU machine (carry .whl), from the repository root:\n{COMMAND}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
