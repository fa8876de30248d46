"""atheris target: the tar extractor of the files API (runtime/archive.py). Any blob is
unpacked whole or refused with FilesError, and nothing outside the target changes."""

import os
import shutil
import tempfile

from _common import run

from corral.runtime.files import Caps, Files, FilesError

TOP = tempfile.mkdtemp(prefix="corral-atheris-tar-")


def _outside() -> list:
    out = []
    for d, dirs, files in os.walk(TOP):
        for n in dirs + files:
            p = os.path.join(d, n)
            if not p.startswith(os.path.join(TOP, "root", "t")):
                st = os.lstat(p)
                out.append((p, st.st_mode, st.st_size, st.st_mtime_ns))
    return sorted(out)


def one_input(data: bytes) -> None:
    shutil.rmtree(TOP)
    os.makedirs(os.path.join(TOP, "root", "t"))
    os.makedirs(os.path.join(TOP, "outside"))
    os.symlink("../../outside", os.path.join(TOP, "root", "t", "link"))
    before = _outside()
    fd = os.open(os.path.join(TOP, "root"), os.O_PATH | os.O_DIRECTORY)
    try:
        with Files(fd, os.getuid(), os.getgid(), caps=Caps(write=1 << 20, members=64)) as f:
            try:
                f.write_archive("/t", data)
            except FilesError as e:
                assert "\n" not in str(e)
    finally:
        os.close(fd)
    assert _outside() == before, "something outside the target changed"


if __name__ == "__main__":
    run(one_input)
