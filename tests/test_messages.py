"""The one check every received header gets: known type, fields present and of their types."""

import pytest

from workers.messages import ACK, INFER_FRAME, RESULT, SCHEMAS, STATS, check_fields, validate
from workers.transport import ProtocolError


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


def test_stage_content_is_checked_by_the_stage():
    with pytest.raises(ProtocolError, match="'infer'"):
        check_fields({"name": "a", "cycle": 0, "ratio": 1.0, "pad": [0, 0], "orig_shape": [1, 1], "lb_shape": [1, 1],
                      "keep_image": False, "pre": "pre-0", "t": {}, "px": {}, "release_by": "infer", "batch": 1,
                      "cold": False}, INFER_FRAME, "frame")


def test_every_schema_type_name_is_known():
    known = {"int", "float", "str", "bool", "list", "dict"}
    assert all(spec.lstrip("?") in known for fields in SCHEMAS.values() for spec in fields.values())
