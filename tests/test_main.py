"""``python -m yolo`` options: the letterbox defaults to rect, as runner.py's does; label options
are checked before anything loads."""

import pytest

from sequential.cli import main, parse_args


@pytest.mark.parametrize("flags, rect", [([], True), (["--rect"], True), (["--square"], False)])
def test_letterbox_defaults_to_rect(flags, rect):
    assert parse_args(flags).rect is rect


def test_rect_and_square_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--rect", "--square"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--save-txt"], "--save-txt: expected --save-dir"),
    (["--save-conf", "--save-dir", "out"], "--save-conf: expected --save-txt"),
])
def test_label_options_need_their_companions(flags, message, caplog):
    assert main(flags) == 2
    assert message in caplog.text
