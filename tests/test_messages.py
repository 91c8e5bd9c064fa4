"""The one check every received header gets: known type, fields present and of their types."""

import pytest

from wire.frame_header import INFER_FRAME, FrameHeader
from wire.messages import ACK, FAILED, RESULT, SCHEMAS, STATS, check_fields, validate
from wire.transport import ProtocolError


def good_result() -> dict:
    return {"type": RESULT, "id": 3, "name": "a.jpg", "t": {"read_start": 1.0, "post_end": 2}, "detections": [],
            "workers": {"pre": "pre-0"}, "batch": 1, "image_saved": False, "cold": False}


def test_a_good_message_passes_with_extra_fields():
    header = {**good_result(), "extra": "kept"}
    assert validate(header, {RESULT}) is header


@pytest.mark.parametrize("change, match", [
    ({"type": "nonsense"}, "expected a message of type"),
    ({"id": "3"}, "'id' of a 'result' message to be int"),
    ({"id": True}, "'id' of a 'result' message to be int"),
    ({"t": {"read_start": "soon"}}, "map names to seconds"),
    ({"detections": None}, "expected field 'detections'"),
])
def test_bad_messages_are_refused_naming_the_field(change, match):
    with pytest.raises(ProtocolError, match=match) as error:
        validate({**good_result(), **change}, {RESULT})
    assert error.value.kind == "schema"


def test_a_type_not_expected_on_this_socket_is_refused():
    with pytest.raises(ProtocolError, match="expected a message of type"):
        validate(good_result(), {STATS})


def test_ack_ids_must_be_ints_and_optional_fields_may_be_absent():
    ack = {"type": ACK, "ids": [1, 2], "n": 2, "to": "pre-0.0"}
    assert validate(ack, {ACK}) is ack  # "release" is optional
    with pytest.raises(ProtocolError, match="list of ints"):
        validate({**ack, "ids": [1, "2"]}, {ACK})


PRE_HEADER = {"id": 7, "name": "a.jpg", "cycle": 0, "ratio": 0.5, "pad": [0.0, 4.0], "orig_shape": [20, 40],
              "lb_shape": [32, 32], "full_shape": [40, 80], "reduction": 2, "keep_image": True, "pre": "pre-0",
              "t": {"read_start": 1.0}, "px": {"lb": {"inline": 0}}, "release_by": "post",
              "video": {"item": 1, "index": 3, "fps": 25.0, "frames": 9}}


def test_stage_content_is_checked_by_the_stage():
    with pytest.raises(ProtocolError, match="'infer'"):
        check_fields({**PRE_HEADER, "batch": 1, "cold": False}, INFER_FRAME, "frame")
    with pytest.raises(ProtocolError, match="'infer'"):
        FrameHeader.from_message({**PRE_HEADER, "batch": 1, "cold": False}, sent_by="infer")
    with pytest.raises(ProtocolError, match="'video'"):
        FrameHeader.from_message({**PRE_HEADER, "video": {"item": -1, "index": 0}}, sent_by="pre")


def test_a_frame_header_survives_its_message_form_and_says_its_letterbox_and_failure():
    header = FrameHeader.from_message({**PRE_HEADER, "type": "frame", "src": "pre-0.0"}, sent_by="pre")
    assert header.video.index == 3 and header.pad == (0.0, 4.0) and header.full_shape == (40, 80)
    assert FrameHeader.from_message(header.to_message(), sent_by="pre") == header
    assert header.letterbox_info().original_shape == (20, 40) and header.letterbox_info().shape == (32, 32)
    failed = validate(header.failed("infer", "infer-0", "bad slot"), {FAILED})
    assert failed["video"] == {"item": 1, "index": 3, "fps": 25.0, "frames": 9} and failed["stage"] == "infer"


def test_every_schema_type_name_is_known():
    known = {"int", "float", "str", "bool", "list", "dict"}
    assert all(spec.lstrip("?") in known for fields in SCHEMAS.values() for spec in fields.values())


def test_each_message_kind_is_one_dataclass_whose_fields_are_its_schema():
    """A message written by its dataclass passes the check its receiver makes, and reads back
    equal; its optional fields are those typed ``X | None`` and go unsent when None."""
    from wire.messages import MESSAGES, Ack, Failed, Stats, schema_of

    assert set(SCHEMAS) == {kind.TYPE for kind in MESSAGES}
    for kind in MESSAGES:
        assert SCHEMAS[kind.TYPE] == schema_of(kind)
    ack = Ack([4, 5], 2, "pre-0.0")
    assert ack.to_message() == {"type": ACK, "ids": [4, 5], "n": 2, "to": "pre-0.0"}  # release None: not sent
    assert Ack.from_message(validate(ack.to_message(), {ACK})) == ack
    failed = Failed(7, "a.jpg", "post", "post-1", "boom", cycle=0, video={"item": 1, "index": 2})
    assert Failed.from_message(validate(failed.to_message(), {FAILED})) == failed
    stats = Stats("pre-0", "pre", 0, 10, 3, 1.0, 0.5, 0.4, 0.6, 0.2, 0.1, {}, {}, {}, extra={"position": 3})
    sent = validate(stats.to_message(), {STATS})
    assert sent["position"] == 3 and "extra" not in sent  # the stage's own fields go beside the common ones
    with pytest.raises(ProtocolError, match="'n' of a 'ack' message to be int"):
        Ack.from_message({**ack.to_message(), "n": "2"})


def test_the_frame_header_schemas_are_its_fields():
    from wire.frame_header import PRE_FRAME
    names = [f for f in FrameHeader.__dataclass_fields__]
    assert list(INFER_FRAME) == names and set(names) - set(PRE_FRAME) == {"infer", "batch", "cold"}
    assert PRE_FRAME["video"] == "?dict" and PRE_FRAME["pad"] == "list"
