"""Reads a TensorBoard log directory with TensorBoard's own readers and prints what it holds as JSON.

The oracle of tensorboard_test and the daemon's TensorBoard tests (PyPI `tensorboard`):
  python read_tfevents.py DIR
prints {"files": [...], "scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text]]},
"hparams": {name: value}, "plugins": {plugin: [tags]}, "masked_crc_123456789": int}.
Every record of every file, in TensorBoard's file order, nothing purged: a step logged twice shows
twice. A file TensorBoard cannot read raises (the test then fails).
"""
import glob
import json
import os
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util


def main():
    logdir = sys.argv[1]
    out = {"files": [], "scalars": {}, "texts": {}, "hparams": {}, "plugins": {},
           "masked_crc_123456789": masked_crc32c(b"123456789")}
    files = sorted(f for f in glob.glob(os.path.join(logdir, "*")) if "tfevents" in os.path.basename(f))
    for path in files:
        out["files"].append(os.path.basename(path))
        for event in event_file_loader.LegacyEventFileLoader(path).Load():
            for v in event.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":
                    out["scalars"].setdefault(v.tag, []).append([event.step, v.simple_value])
                elif v.metadata.plugin_data.plugin_name == "text":
                    text = tensor_util.make_ndarray(v.tensor).item().decode("utf-8")
                    out["texts"].setdefault(v.tag, []).append([event.step, text])
                elif v.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                    for name, value in data.session_start_info.hparams.items():
                        kind = value.WhichOneof("kind")
                        out["hparams"][name] = getattr(value, kind)
    # How TensorBoard's own accumulator classifies the tags (its dashboards use this).
    acc = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0}, purge_orphaned_data=False)
    acc.Reload()
    for plugin in acc.ActivePlugins():
        out["plugins"][plugin] = sorted(acc.PluginTagToContent(plugin).keys())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
