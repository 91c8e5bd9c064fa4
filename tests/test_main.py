"""``python -m yolo`` options: the letterbox defaults to rect, as runner.py's does."""

import pytest

from yolo.__main__ import parse_args


@pytest.mark.parametrize("flags, rect", [([], True), (["--rect"], True), (["--square"], False)])
def test_letterbox_defaults_to_rect(flags, rect):
    assert parse_args(flags).rect is rect


def test_rect_and_square_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--rect", "--square"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
