"""Files written whole or not at all: the bytes go to a temporary file in the same folder, are
flushed to disk, and only then renamed over the target (``os.replace``, atomic on POSIX). A full
disk or any other error leaves the target as it was (absent, or its previous content) and no
temporary file behind."""

from __future__ import annotations

import os
import secrets

NEW_FILE_MODE = 0o666  # less the umask, as open() would give


def write_bytes_atomic(path: str, data: bytes) -> None:
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # tmpfs and ext4 may accept the write and fail on flush
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
