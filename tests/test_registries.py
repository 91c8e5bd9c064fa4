"""The registries of backends (backends/registry.py) and input kinds (inputs/kinds.py): a backend
or a kind registered from outside the tree, here from this test module after everything was
imported, is offered and used wherever the tree's own are."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.machine import Machine
from analysis.report import inference_of
from backends import registry
from backends.options import BackendOptions
from backends.registry import BackendSpec, backend_names, backend_packages
from inputs import kinds
from inputs.frames import Frame, SourceItem
from inputs.kinds import InputKind, Planning
from inputs.reader import ShareReader, open_share
from inputs.sources import plan_frames
from settings.config import RunConfig
from supervisor.console import model_words
from sweep.measurement import Measurement
from sweep.moves import Settings, propose

WRAPPED = BackendSpec("wrapped", __name__, devices=("cpu",), engine="Wrapped torch", packages=("torch",),
                      sweep="the wrapped forward")
SOLID_SIDE = 8


def load(options: BackendOptions):
    """This module as a backend's module: torch's backend, wrapped."""
    from backends import torch_backend
    return torch_backend.load(options)


@pytest.fixture
def wrapped():
    registry.register(WRAPPED)
    yield WRAPPED
    registry.unregister(WRAPPED.name)


def test_a_registered_backend_is_offered_labelled_and_loaded(wrapped):
    assert "wrapped" in backend_names() and "wrapped" in registry.NAMES  # the constant reads the registry
    assert backend_packages()[:3] == ("torch", "torchvision", "openvino")  # the environment's versions, once each
    registry.check_backend("wrapped", "cpu")
    with pytest.raises(ValueError, match="runs on the CPU"):
        registry.check_backend("wrapped", "cuda")
    model = registry.load_backend("wrapped", BackendOptions(weights=None, preset="yolov5n"))
    assert model.name == "torch" and model.model.num_params() > 0  # torch's backend, loaded through this module
    with pytest.raises(ValueError, match="registered already"):
        registry.register(BackendSpec("wrapped", "elsewhere"))
    registry.register(WRAPPED)  # the same spec again: a plugin imported twice


def test_the_report_and_the_start_line_name_a_registered_backend(wrapped):
    stages = {"infer": {"per_worker": []}}
    label = inference_of(stages, {"backend": "wrapped", "devices": ["cpu"]}, {"torch": "2.x"})["backend"]
    assert label == "Wrapped torch 2.x on cpu"
    assert model_words(RunConfig(backend="wrapped", devices=("cpu",))) == "random-weight yolov5n in fp32 (Wrapped torch)"
    # a record naming a backend this process has not registered is still labelled, by its name
    assert inference_of(stages, {"backend": "gone", "devices": ["cpu"]}, {})["backend"] == "gone on cpu"


def test_the_sweep_moves_to_a_registered_backend_where_it_is_ready(wrapped):
    assert [spec.name for spec in registry.sweep_alternatives("cpu")] == ["openvino", "wrapped"]
    assert registry.sweep_alternatives("cuda") == []
    assert registry.ready_for_sweep("wrapped", BackendOptions(weights=None))  # its module says nothing against it
    analysis = Measurement(fps=50.0, bottleneck="infer", limit="cores", cpu_saturation=0.97,
                           utilisation={"pre": 0.3, "infer": 0.98, "post": 0.2})
    incumbent = Settings(pre_workers=1, infer_workers=1, post_workers=1, infer_threads=1, batch_size=1)
    moves = propose(incumbent, analysis, Machine(cores=2), backends=("wrapped",))
    move = next(m for m in moves if m.key == ("backend", +1))
    assert move.settings.backend == "wrapped" and move.reason == "cores saturated: the wrapped forward"
    assert move.settings.label().endswith(" wrapped")
    assert all(m.settings.backend == "torch" for m in propose(incumbent, analysis, Machine(cores=2)))


def plan_solid(source: str, planning: Planning) -> list[SourceItem]:
    """``solid:N``: N scenes of one grey level each."""
    return [SourceItem("solid", "", f"solid/{i}.png", 1) for i in range(int(source.partition(":")[2]))]


def read_solid(ref, reader) -> Frame:
    image = np.full((SOLID_SIDE, SOLID_SIDE, 3), 10 * ref.source_index, np.uint8)
    return Frame(ref, image, image.shape[:2])


def read_grey_file(ref, reader) -> Frame:
    image = np.full((SOLID_SIDE, SOLID_SIDE, 3), int(open(ref.location).read()), np.uint8)
    return Frame(ref, image, image.shape[:2])


SOLID = InputKind("solid", read=read_solid, numbered_by_item=True, recognise=lambda source: source.startswith("solid:"),
                  plan=plan_solid)
GREY_FILE = InputKind("grey", read=read_grey_file, extensions=frozenset({".grey"}))


@pytest.fixture
def solid():
    for kind in (SOLID, GREY_FILE):
        kinds.register(kind)
    yield SOLID
    for kind in (SOLID, GREY_FILE):
        kinds.unregister(kind.name)


def test_a_registered_input_kind_is_chosen_for_its_sources_and_its_frames_are_read(solid):
    plan = plan_frames("solid:3")
    assert [item.kind for item in plan.items] == ["solid"] * 3 and plan.total == 3
    with open_share(plan) as reader:
        assert isinstance(reader, ShareReader)
        frames = [reader.next() for _ in range(3)]
        assert reader.next() is None
    assert [int(f.image[0, 0, 0]) for f in frames] == [0, 10, 20]  # each scene its own (numbered by item)
    assert [f.ref.name for f in frames] == ["solid/0.png", "solid/1.png", "solid/2.png"]


def test_a_registered_kind_reads_its_files_in_a_folder(solid, tmp_path):
    (tmp_path / "a.grey").write_text("77")
    (tmp_path / "notes.csv").write_text("left out")
    plan = plan_frames(str(tmp_path))
    assert [(item.kind, item.name) for item in plan.items] == [("grey", "a.grey")] and plan.skipped_files == 1
    with ShareReader(plan) as reader:
        assert int(reader.next().image[0, 0, 0]) == 77


def test_a_kind_is_refused_when_it_takes_a_name_or_an_extension_already_taken():
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(InputKind("image"))
    with pytest.raises(ValueError, match=r"\.jpg .*read as image"):
        kinds.register(InputKind("jpeg-too", read=read_solid, extensions=frozenset({".jpg"})))
    with pytest.raises(ValueError, match="recognise and plan together"):
        kinds.register(InputKind("half", recognise=lambda source: False))
    with pytest.raises(ValueError, match="expected an input kind of .*got 'nowhere'"):
        kinds.input_kind("nowhere")
