"""The backends: `contract` (what a backend implements: HeadOptions and Options, the Backend protocol, the dtype
rule), `registry` (discovery and resolution by device), and one module or package per backend: `torch_chunked`,
`triton`, `npu_backend`. Overview: docs/design.md."""

from sgrpo_kernels.backends.contract import Backend, HeadOptions, Options, stats_dtype
from sgrpo_kernels.backends.registry import (
    ENV_BACKEND,
    BackendUnavailableError,
    available_backends,
    backend_names,
    get,
    resolve,
)

__all__ = [
    "ENV_BACKEND",
    "Backend",
    "BackendUnavailableError",
    "HeadOptions",
    "Options",
    "available_backends",
    "backend_names",
    "get",
    "resolve",
    "stats_dtype",
]
