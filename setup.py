from setuptools import find_packages, setup

with open("README.md", encoding="utf-8") as handle:
    long_description = handle.read()

setup(
    name="gpu_task_scheduler",
    version="0.1.0",
    description="Config-driven hyperparameter sweeps over your GPUs: crash-safe, resumable, drop-in for GPUTaskScheduler.",
    long_description=long_description,
    long_description_content_type="text/markdown",
    packages=find_packages(include=["gpu_task_scheduler", "gpu_task_scheduler.*"]),
    package_data={"gpu_task_scheduler": ["py.typed"]},
    python_requires=">=3.8",
    install_requires=[
        "PyYAML>=5.1",
        "lazy-object-proxy>=1.6",
        # NVIDIA's own NVML bindings (module `pynvml`). The PyPI package named
        # `pynvml` is now a shim over this one that warns on import.
        "nvidia-ml-py>=11.450",
    ],
    extras_require={
        "results": ["pandas>=1.3"],
        "plot": ["matplotlib>=3.5"],
        "test": ["pytest>=7", "pytest-timeout>=2.1", "hypothesis>=6", "pandas>=1.3", "matplotlib>=3.5"],
    },
    entry_points={"console_scripts": ["gts = gpu_task_scheduler.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Operating System :: MacOS",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
