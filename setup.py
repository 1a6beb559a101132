import re

from setuptools import find_packages, setup

# The distribution is named gts-sweep: "gpu-task-scheduler" on the package index is an unrelated
# project with the same import package. The import package stays gpu_task_scheduler (the drop-in).
with open("README.md", encoding="utf-8") as handle:
    long_description = handle.read()
with open("gpu_task_scheduler/version.py", encoding="utf-8") as handle:
    version = re.search(r'^__version__ = "([^"]+)"', handle.read(), re.M).group(1)

FRAMEWORKS = {
    "lightning": ["lightning>=2.0"],
    "transformers": ["transformers>=4.41", "accelerate>=1.1"],
    "keras": ["keras>=3.0"],
    "xgboost": ["xgboost>=2.0"],
    "lightgbm": ["lightgbm>=4.0"],
}

setup(
    name="gts-sweep",
    version=version,
    description=(
        "Config-driven hyperparameter sweeps over your GPUs: crash-safe, resumable, drop-in for GPUTaskScheduler."
    ),
    long_description=long_description,
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    author="The gpu_task_scheduler authors",
    keywords=["hyperparameter", "sweep", "gpu", "scheduler", "nvml", "experiments"],
    packages=find_packages(include=["gpu_task_scheduler", "gpu_task_scheduler.*"]),
    package_data={"gpu_task_scheduler": ["py.typed"], "gpu_task_scheduler.web": ["static/*"]},
    # 3.10 reached its end of life in October 2026, and the test extra needs 3.11 (pandas 3.1, SciPy
    # 1.17). The one list of the versions supported: this, the classifiers below, the README.
    python_requires=">=3.11",
    install_requires=[
        "PyYAML>=6.0.1",
        "lazy-object-proxy>=1.9",
        # NVIDIA's own NVML bindings (module `pynvml`; the PyPI package named `pynvml` is a shim
        # over this one). 12.535 is the oldest tested here; older ones read per-process memory
        # wrongly on current drivers.
        "nvidia-ml-py>=12.535.77",
    ],
    extras_require={
        "results": ["pandas>=1.3"],
        "plot": ["matplotlib>=3.5"],
        # Task classes defined interactively (a notebook, the REPL) are carried to their
        # process by value.
        "interactive": ["cloudpickle>=2.0"],
        # Sweeps over the GPUs of several machines (backend: ray; see backends/ray/).
        "ray": ["ray>=2.10"],
        # Adaptive search (search: {sampler: tpe | cmaes | qmc}): Optuna's samplers, imported
        # only by a sweep that asks for one; sampler: random needs nothing.
        "search": ["optuna>=3.6", "cmaes>=0.10", "scipy>=1.7"],
        # gts importance: Optuna's evaluators (PED-ANOVA needs nothing more; fANOVA fits
        # scikit-learn's random forest).
        "importance": ["optuna>=3.6", "scikit-learn>=1.0"],
        # The charts of `gts serve` (the view itself needs nothing): Plotly's JavaScript, served from
        # the package, so the page works with no internet.
        "web": ["plotly>=5.0"],
        # The documentation site (mkdocs.yml, docs/): `mkdocs serve`, or `mkdocs build --strict` as CI does.
        "docs": ["mkdocs>=1.5", "mkdocs-material>=9.0"],
        # metrics: {tensorboard: ...} (a run's event files as its metrics) and gts export --to tensorboard:
        # TensorBoard's own event-file loader and summaries (no TensorFlow needed).
        "tensorboard": ["tensorboard>=2.12"],
        # gts export --to mlflow URI / --to wandb: the trackers' own clients.
        "mlflow": ["mlflow>=2.10"],
        "wandb": ["wandb>=0.17"],
        # The frameworks the callbacks of gpu_task_scheduler.integrations (and examples/integrations/)
        # work with, one extra each, and all of them: a script's own framework is what it needs, and
        # nothing here is imported before its module is. PyTorch comes with Lightning; Keras 3 runs
        # on it (KERAS_BACKEND=torch). Install times: docs/integrations.md.
        **FRAMEWORKS,
        "integrations": [*(need for needs in FRAMEWORKS.values() for need in needs), "tensorboard>=2.12"],
        "test": [
            # The lower bounds are the versions the whole suite passed on (and .ci/run, in a fresh
            # virtual environment, on the newest pip resolves).
            # Below 9.2: pytest 9.2 keeps a node's id in Node._id, and pytest-xdist 3.8 still
            # writes its group (xdist_group, --dist loadgroup) into Node._nodeid, so every group
            # is silently spread over the workers (tests/test_layout.py checks the groups hold).
            "pytest>=9.0.3,<9.2",
            "pytest-timeout>=2.4.0",
            "pytest-xdist>=3.8.0",
            "hypothesis>=6.155.2",
            "pandas>=3.1.1",
            "matplotlib>=3.11.2",
            "cloudpickle>=3.1.3",
            "ray>=2.60.0",
            "optuna>=5.0.0",
            "cmaes>=0.13.1",
            "scipy>=1.17.1",
            "scikit-learn>=1.9.1",
            "plotly>=7.1.0",
            # The web view's tests drive a real browser (Chromium, from the system's packages).
            "playwright>=1.65.2",
            "ruff>=0.17.6",
            "mypy>=2.4.1",
            # .ci/run builds the documentation site strictly: a broken link or page fails CI.
            "mkdocs>=1.6.1",
            "mkdocs-material>=9.8.2",
            # The integrations' tests train real models on the CPU (tests/test_integration_*.py) and
            # read exports back with each tracker's own reader (tests/test_export.py). XGBoost's CPU
            # package: the same module, without the NVIDIA libraries.
            "lightning>=2.6.6",
            "transformers>=5.24.0",
            "accelerate>=1.15.0",
            "keras>=3.15.1",
            "xgboost-cpu>=3.2.0",
            "lightgbm>=4.7.0",
            "tensorboard>=2.21.0",
            "mlflow>=3.17.2",
            "wandb>=0.31.0",
        ],
    },
    entry_points={"console_scripts": ["gts = gpu_task_scheduler.cli:main"]},
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
)
