"""Reading the offline run files W&B writes (``run-<id>.wandb``) with W&B's own record definitions
(``wandb.proto.wandb_internal_pb2.Record``). The framing is W&B's: a 7-byte header (``:W&B``, a
magic number, a version), then LevelDB log blocks of 32 KiB whose chunks each have a 7-byte header
(checksum, length, type: 1 whole, 2 first, 3 middle, 4 last)."""

import glob
import json
import os
import struct

BLOCK = 32768


def records(path):
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    at, pieces = 7, []
    while at + 7 <= len(data):
        left = BLOCK - at % BLOCK
        _, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
            at += left
            continue
        pieces.append(data[at + 7 : at + 7 + length])
        at += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            yield record


def offline_runs(folder):
    """``{run id: {"name", "group", "config", "history": [{key: value}], "summary", "files"}}`` of every
    offline run under ``folder/wandb`` (a run resumed offline has several folders: merged)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))):
        run = None
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = runs.setdefault(
                    record.run.run_id,
                    {"name": record.run.display_name, "group": record.run.run_group, "config": {}, "history": []}
                    | {"summary": {}, "files": []},
                )
                run["files"].append(path)
                for item in record.run.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "config" and run is not None:  # config.update() after init
                for item in record.config.update:
                    run["config"]["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
            elif kind == "history" and run is not None:
                run["history"].append(
                    {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                )
            elif kind == "summary" and run is not None:
                for item in record.summary.update:
                    run["summary"]["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return runs
