"""MosaicML streaming's own classes, imported without its package's __init__ files.

`import streaming` runs streaming/__init__.py, which imports streaming.vision (torchvision) and
streaming.base.dataloader (transformers). Neither installs beside the CPU torch 2.13.0 here:
PyPI's torchvision 0.28.0 fails to load against it ("operator torchvision::nms does not exist"),
and transformers 4 (which streaming 0.10 requires) wants huggingface-hub < 1, while Accelerate's
pin here brings 2.x. The classes tested, StreamingDataset (streaming/base/dataset.py) and
MDSWriter, import neither: this registers `streaming` and `streaming.base` as bare packages on
their own folders, so that their modules load unmodified and the __init__ files do not run. On
a machine with a CUDA torch and torchvision, `from streaming import StreamingDataset` is the same
class (docs/testing.md).
"""
import importlib
import importlib.util
import sys
import types


def mosaic() -> types.SimpleNamespace:
    """StreamingDataset and MDSWriter from the installed mosaicml-streaming."""
    if "streaming" not in sys.modules:
        root = list(importlib.util.find_spec("streaming").submodule_search_locations)
        for name, path in (("streaming", root), ("streaming.base", [p + "/base" for p in root])):
            package = types.ModuleType(name)
            package.__path__ = path
            sys.modules[name] = package
    dataset = importlib.import_module("streaming.base.dataset")
    writer = importlib.import_module("streaming.base.format.mds.writer")
    return types.SimpleNamespace(StreamingDataset=dataset.StreamingDataset, MDSWriter=writer.MDSWriter)
