"""specjax: exact speculative decoding in JAX, wired to T5X checkpoints and gin."""
import os

from setuptools import find_packages, setup

# The top-level gin/ folder is installed inside the package as specjax/gin (as T5X ships its
# gin files), so a wheel finds runs/default.gin from any working directory.
GIN_PACKAGES = ["specjax.gin" + root[len("gin"):].replace(os.sep, ".")
                for root, _, _ in os.walk("gin") if "__pycache__" not in root]

# Every file under specjax/assets by its own path: a glob such as "assets/**/*" skips dotfiles, and
# each array of a bundled T5X checkpoint keeps its zarr metadata in a `.zarray` dotfile.
ASSETS = sorted(os.path.relpath(os.path.join(root, name), "specjax")
                for root, _, names in os.walk(os.path.join("specjax", "assets")) for name in names)

# The JAX releases specjax supports; the accelerator extras pull the matching jax plugin.
# JAX 0.11 and newer need Python >= 3.12, so a Python 3.11 environment resolves to 0.10.x.
JAX_RANGE = ">=0.10.0,<0.13"

setup(
    name="specjax",
    version="0.1.0",
    description="Speculative decoding (Leviathan et al. 2023) in JAX/Flax for T5X models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # experiments/ are scripts run from the checkout (python -m experiments.X), not installed.
    packages=find_packages(include=["specjax", "specjax.*"]) + GIN_PACKAGES,
    package_dir={"specjax.gin": "gin"},
    include_package_data=True,
    package_data={"specjax": ASSETS, **{p: ["*.gin"] for p in GIN_PACKAGES}},
    install_requires=[
        "jax" + JAX_RANGE,
        "jaxlib" + JAX_RANGE,
        "flax>=0.12.8,<0.13",
        "optax>=0.2.4",
        "gin-config>=0.5.0",
        "numpy>=1.26",
        "tensorstore>=0.1.60",
        "msgpack>=1.0",
        "ml_dtypes>=0.4",
        "sentencepiece>=0.2.0",
        "rich>=13.0",
    ],
    extras_require={
        "cuda12": ["jax[cuda12]" + JAX_RANGE],
        "cuda13": ["jax[cuda13]" + JAX_RANGE],
        "tpu": ["jax[tpu]" + JAX_RANGE],
        # Compiling for GPUs and TPUs on a host without them: JAX's CUDA 13 plugin without
        # NVIDIA's libraries (cuda13-local) and libtpu, each pinned by JAX to its own release.
        # JAX 0.12 at least: the first whose CUDA plugin carries XLA's GPU target configs (GPUs
        # by name; 0.10 and 0.11 compile only for a GPU given as a file), so Python >= 3.12.
        "aot": ["jax[cuda13-local,tpu]>=0.12.0.1,<0.13"],
        # gcp-storage-emulator: a GCS API server on 127.0.0.1 for the gs:// tests (gs:// itself
        # needs nothing beyond tensorstore).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "orbax-checkpoint>=0.11",
                 "gcp-storage-emulator>=2026.7"],
        "seqio": ["seqio>=0.0.19", "sacrebleu>=2.4"],
        "experiments": ["matplotlib>=3.8", "sacrebleu>=2.4", "nbclient>=0.10", "nbformat>=5.10",
                        "ipykernel>=6.29", "nbconvert>=7.16"],
        "hf": ["torch==2.13.0", "transformers>=5"],
        # The gemma library, for the conformance tests and to write or convert Gemma
        # checkpoints and configs; specjax decodes Gemma without it. Python >= 3.12 only.
        "gemma": ["gemma>=4.0.1; python_version>='3.12'",
                  "protobuf>=7.36; python_version>='3.12'"],
    },
    entry_points={"console_scripts": ["specjax=specjax.app.main:cli"]},
)
