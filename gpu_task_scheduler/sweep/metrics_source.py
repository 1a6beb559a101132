"""The config's ``metrics`` section: where each run's TensorBoard event files are, read as its
metric stream (``records/tensorboard.py`` reads them; ``engine/feeds.py`` feeds them).

    metrics: {tensorboard: '{work_dir}/lightning_logs', tags: [val_loss, 'train_*']}
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError
from .commands import BUILTINS
from .templates import check_fields

KEYS = ("tensorboard", "tags")


class TensorBoardSource:
    """The ``metrics:`` section: the folder template, and the tags kept (glob patterns; None: all)."""

    def __init__(self, folder: str, tags: tuple[str, ...] | None) -> None:
        self.folder, self.tags = folder, tags

    def wants(self, tag: str) -> bool:
        return self.tags is None or any(fnmatch.fnmatchcase(tag, pattern) for pattern in self.tags)


def parse_metrics(raw: Any, known_keys: set[str]) -> TensorBoardSource | None:
    """The config's ``metrics`` section; ConfigError for anything else than what it may say."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"metrics must be a mapping such as {{tensorboard: '{{work_dir}}/logs'}}; got {raw!r}")
    unknown = sorted(set(map(str, raw)) - set(KEYS))
    if unknown:
        raise ConfigError(f"metrics: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}")
    folder = raw.get("tensorboard")
    if not isinstance(folder, str) or not folder.strip():
        raise ConfigError(
            f"metrics: tensorboard must name each run's TensorBoard folder, such as '{{work_dir}}/lightning_logs'; "
            f"got {folder!r}"
        )
    check_fields(folder, known_keys | set(BUILTINS), what="metrics: tensorboard")
    tags = raw.get("tags")
    if tags is not None:
        if isinstance(tags, str):
            tags = [tags]
        if not isinstance(tags, list) or not tags or not all(isinstance(t, str) and t for t in tags):
            raise ConfigError(f"metrics: tags must be a list of tag names or patterns (val_* say); got {tags!r}")
        tags = tuple(tags)
    try:
        import tensorboard.backend.event_processing.event_file_loader  # noqa: F401
    except ImportError:
        raise ConfigError(
            "metrics: tensorboard reads event files with TensorBoard's own loader: pip install tensorboard "
            "(or the extra: pip install 'gts-sweep[tensorboard]')"
        ) from None
    return TensorBoardSource(folder, tags)


def metrics_source(
    raw: Any, stages: Iterable[Any], space: Iterable[str], rules: Iterable[Any]
) -> TensorBoardSource | None:
    """A sweep's ``metrics`` section, its templates checked against the keys of its ``stages`` (and a
    search's ``space``); ConfigError also when runs fed from TensorBoard would be judged by a pausing
    method (``rules``: the stages' early_stop rules): they never wait for a verdict, so they can be
    stopped, not paused at a step."""
    if raw is None:
        return None  # a start without the section does nothing more (and imports no early_stop rule)
    stages = list(stages)
    keys = {key for stage in stages for key in stage.global_config}
    keys |= {key for stage in stages for block in stage.blocks for key in block}
    source = parse_metrics(raw, keys | set(space))
    assert source is not None
    from ..tuning.stopping import Pausing

    if any(isinstance(rule, Pausing) for rule in rules):
        raise ConfigError(
            "metrics: tensorboard feeds runs that never wait for a verdict, so they can be stopped early but not "
            "paused at a step: use early_stop's method asha (without promotion) or median, or report() from the "
            "script (gpu_task_scheduler.integrations has callbacks that do)"
        )
    return source
